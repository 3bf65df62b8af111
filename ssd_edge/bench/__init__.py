"""`ssd-edge bench`: run (the runs and their JSON), schema (the result file's records),
report (tables and plots from a result), peer (llama.cpp's own speculative decoding, the peer column);
bound (`python -m ssd_edge.bench.bound`: the most any planner could make of a pair, an oracle bound)."""
