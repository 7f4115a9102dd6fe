"""Files in, kept in sync: what :meth:`Index.build <twotower.Index.build>` does with a folder, a file or a glob
(:mod:`twotower.data.files` reads them), what it does over an index that is already there (``mode``), and
:meth:`Index.sync <twotower.Index.sync>` (:mod:`twotower.retrieval.sync` plans and writes it).

Example::

    import twotower as tt

    index = tt.Index.build("notes-index", "my-notes")        # every .txt .md .html .pdf .docx file, one command
    print(index.skipped)                                     # the files left out, with their reasons
    report = index.sync("my-notes")                          # later: only new or changed files are encoded
    print(report)                                            # {"added": 1, "updated": 0, "removed": 0, ...}
"""

from __future__ import annotations

from pathlib import Path

from twotower.api._errors import user_errors
from twotower.errors import TwoTowerError

MODES = ("create", "overwrite", "append")


def check_mode(path: Path, mode: str) -> bool:
    """Whether an index is already at ``path``; refuses ``mode`` ``create`` there (naming the other modes), and any
    mode but the three."""
    from twotower.checks import flag

    if mode not in MODES:
        raise TwoTowerError(f"{flag('mode')} {mode!r}: choose create (a new index), overwrite (replace the index "
                            "there) or append (add to it)")
    there = (Path(path) / "CURRENT").exists()
    if there and mode == "create":
        raise TwoTowerError(
            f"{path} already holds an index: building over it would replace its documents. Bring it up to date "
            f"with Index.sync / twotower index sync, add to it with {_mode('append')}, or replace it with "
            f"{_mode('overwrite')}")
    return there


def _mode(value: str) -> str:
    """A build mode as the caller gives it: ``mode='append'`` in Python, the flag on the command line."""
    from twotower.checks import naming, switch

    return switch(value if value != "overwrite" else "replace") if naming() == "cli" else f"mode={value!r}"


def read_corpus(corpus, path: Path, *, max_file_bytes: int | None, show_progress: bool):
    """``(corpus, skipped)``: a folder, file or glob of files read into documents (the index folder ``path`` left
    out), with the files skipped (``[{"path", "reason"}]``); any other corpus as it is, with no skipped files."""
    from twotower.data.files import MAX_FILE_BYTES, is_file_source, load_files

    if not is_file_source(corpus):
        if max_file_bytes is not None:
            raise TwoTowerError("max_file_bytes limits files read from a folder, a file or a glob; this corpus is "
                                "none of those: drop it")
        return corpus, []
    loaded = load_files(corpus, exclude=[path], show_progress=show_progress,
                        max_bytes=MAX_FILE_BYTES if max_file_bytes is None else max_file_bytes)
    return loaded.documents, [s.to_dict() for s in loaded.skipped]


class Syncing:
    """:meth:`sync` for :class:`~twotower.Index` (``self._searcher``, ``self._lock``, ``self.precision``,
    ``self.device``)."""

    @user_errors
    def sync(self, source, *, dry_run: bool = False, max_file_bytes: int | None = None, batch_size: int | None = None,
             show_progress: bool = False, lock_timeout: float | None = 60.0) -> dict:
        """Bring the index up to date with the files in ``source`` (a folder, a file or a glob, read as
        :meth:`build` reads them) in one atomic write: new files added, changed files (by the SHA-256 of their
        bytes) re-encoded — and only they —, documents whose file is gone removed. Documents not read from files
        are left alone; a file that cannot be read now keeps its indexed document. ``dry_run``: nothing written,
        the report says what would change. Returns ``{"added": n, "updated": n, "removed": n, "unchanged": n,
        "skipped": [{"path", "reason"}, ...]}``.

        Example::

            report = index.sync("my-notes", dry_run=True)
            print(report["added"], report["updated"], report["removed"])
        """
        from twotower.checks import check_number, flag
        from twotower.data.files import is_file_source
        from twotower.retrieval.index.lock import lock_timeout as waiting
        from twotower.retrieval.indexing import EncodeConfig
        from twotower.retrieval.sync import apply_sync, plan_sync

        if not isinstance(dry_run, bool):
            raise TwoTowerError(f"{flag('dry_run')}: True or False, not {dry_run!r}")
        check_number(batch_size, "batch_size", integer=True, minimum=1, optional=True)
        if not is_file_source(source):
            raise TwoTowerError(f"{source}: sync reads a folder of files, a file (.txt .md .html .pdf .docx) or a "
                                "glob; for a BEIR folder or a .jsonl corpus use add(..., replace=True) and remove()")
        docs, skipped = read_corpus(source, self.path, max_file_bytes=max_file_bytes, show_progress=show_progress)
        with self._lock:
            searcher = self._searcher
            searcher.refresh()
            plan = plan_sync(searcher.store, docs, skipped)
            if dry_run or not plan.changes:
                return plan.report()
            cfg = EncodeConfig(batch_size=batch_size, precision=self.precision, device=self.device,
                               show_progress=show_progress)
            with waiting(lock_timeout):
                searcher.store = apply_sync(searcher.store, plan, encoder=searcher.encoder, cfg=cfg,
                                            source=str(source))
            searcher.refresh()
            self.added_ids = plan.added + plan.updated
        return plan.report()


__all__ = ["MODES", "Syncing", "check_mode", "read_corpus"]
