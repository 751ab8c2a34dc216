#!/usr/bin/env bash
# Installs vLLM's KV-cache manager as the peer of `python -m atom.bench.control_plane --peer vllm`,
# into the active Python environment, on a CPU machine, without replacing its torch.
# vLLM's own requirements would pull a CUDA torch, so every package goes in with --no-deps: vLLM,
# then exactly the pure-Python (or small binary-wheel) modules that the import chain of
# vllm.v1.core.kv_cache_manager needs. Versions are the ones the published figures were taken with.
set -euo pipefail
python -m pip install --no-deps \
    vllm==0.33.0 \
    psutil==7.2.2 pyzmq==27.3.0 urllib3==2.8.0 regex==2026.11.19 msgspec==0.23.0 cbor2==6.3.0 \
    transformers==5.24.0 aiohttp==3.14.5 multidict==7.2.1 attrs==26.1.0 yarl==1.25.1 propcache==0.5.4 \
    aiohappyeyeballs==2.7.1 aiosignal==1.4.0 frozenlist==1.8.0 requests==2.34.2 charset-normalizer==3.5.3 \
    openai-harmony==0.0.8 pybase64==1.5.1 cachetools==8.0.2 cloudpickle==3.1.3 uvloop==0.23.0 \
    py-cpuinfo==9.0.0 xgrammar==0.2.9 apache-tvm-ffi==0.1.15.post2 partial-json-parser==0.2.1.1.post7 \
    llguidance==1.9.1
python -W ignore -c "import vllm, vllm.v1.core.kv_cache_manager; print('vLLM', vllm.__version__, 'KV-cache manager imports')"
