export PYTHONPATH=/tmp/site:/tmp/w/src:/tmp/w/benchmarks HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TWOTOWER_DATA=/tmp/data TWOTOWER_TEST_DATA=/tmp/data TWOTOWER_HOME=/tmp/tth
