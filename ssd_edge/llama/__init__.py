"""The llama.cpp adapter: backend (the only importer of llama_cpp), kvseq (a generation's
tokens and each model's KV position), rpc (--rpc servers: the HELLO probe, the launcher).

Empty on purpose: importing ssd_edge.llama.kvseq must not load llama_cpp."""
