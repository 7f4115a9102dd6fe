"""Metrics (pytrec_eval, BEIR conventions), TREC run files, reports."""
