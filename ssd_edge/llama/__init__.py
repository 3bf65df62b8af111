"""The llama.cpp adapter: model (a loaded GGUF: Model) and context (its llama_contexts: Context) behind
the Backend protocol, re-exported together by backend; library (llama_cpp
itself, the only importer of it, loaded on first use), rpc_guard (calls that may wait on an --rpc
server), quantization (requantizing a draft), kvseq (a generation's tokens and each model's KV
position), rpc (--rpc servers: the HELLO probe, the launcher).

Empty on purpose: importing ssd_edge.llama.kvseq must not load llama_cpp."""
