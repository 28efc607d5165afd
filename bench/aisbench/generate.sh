#!/usr/bin/env bash
# Regenerates tests/data/aisbench/: a tiny AISBench (ais-bench-benchmark) perf run against a real
# llama-server (Gemma 3 270M, CPU), kept small enough to commit. See bench/aisbench/README.md.
#
# Steps: (1) AISBench in its own venv outside the repo; (2) Gemma's tokenizer exported from the gguf plus
# the ChatML template llama-server falls back to (AISBench's summarizer loads an HF tokenizer from the
# model `path`; the engine tests use the same export); (3) llama-server on a free loopback port;
# (4) AISBench --mode perf: 8 streaming chat requests, batch_size 2, 8 output tokens, cache_prompt false;
# (5) its perf output copied into tests/data/aisbench/; (6) the server stopped.
# Needs: `bash .ci/install-llama` once (llama-server + model). About 6 minutes the first time (install),
# well under a minute afterwards on an idle 2-core machine.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
cache="${CASELEDGER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/caseledger}"
venv="${AISBENCH_VENV:-$cache/aisbench-venv}"
tok="$cache/gemma-3-270m-tokenizer"
out="$repo/tests/data/aisbench"
requests="${AISBENCH_REQUESTS:-8}"
concurrency="${AISBENCH_CONCURRENCY:-2}"

# shellcheck disable=SC1091
set -a; . "$cache/llama.env"; set +a
: "${CASELEDGER_LLAMA_SERVER:?run bash .ci/install-llama first}" "${CASELEDGER_LLAMA_MODEL:?}"

# (1) AISBench pins numpy<2 and needs torch; the CPU torch wheel first, then pyarrow<21 beside it
if ! "$venv/bin/python" -c "import ais_bench, gguf" >/dev/null 2>&1; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q torch==2.13.0
  "$venv/bin/pip" install -q ais-bench-benchmark "pyarrow<21" gguf
fi
aisv="$("$venv/bin/python" -c "from importlib.metadata import version; print(version('ais-bench-benchmark'))")"

# (2) tokenizer.json from the gguf (~30 s, once) + llama-server's ChatML fallback template with the BOS
# the server adds: its chat-template counts then equal llama-server's usage.prompt_tokens exactly
if [ ! -s "$tok/chat_template.jinja" ]; then
  "$venv/bin/python" - "$CASELEDGER_LLAMA_MODEL" "$tok" <<'EOF'
import sys
from pathlib import Path
from transformers import AutoTokenizer
gguf, dest = Path(sys.argv[1]), sys.argv[2]
t = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
t.chat_template = ("{{ bos_token }}{%- for message in messages -%}\n  {{- '<|im_start|>' + message.role + '\n' + "
                   "message.content + '<|im_end|>\n' -}}\n{%- endfor -%}\n{%- if add_generation_prompt -%}\n  "
                   "{{- '<|im_start|>assistant\n' -}}\n{%- endif -%}")
t.save_pretrained(dest)
print(f"tokenizer exported to {dest}")
EOF
fi

work="$(mktemp -d)"
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
"$CASELEDGER_LLAMA_SERVER" -m "$CASELEDGER_LLAMA_MODEL" --host 127.0.0.1 --port "$port" -c 4096 -np 4 -t 2 \
  --metrics -a gemma-3-270m >"$work/llama-server.log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null; wait "$server" 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 1 600); do
  curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
  kill -0 "$server" 2>/dev/null || { cat "$work/llama-server.log" >&2; exit 1; }
  sleep 0.2
done

# the check behind step (2): the export counts chat prompts as llama-server does
"$venv/bin/python" - "$tok" "$port" <<'EOF'
import json, sys, urllib.request
from transformers import AutoTokenizer
t = AutoTokenizer.from_pretrained(sys.argv[1])
for n in (1, 17, 64):
    msgs = [{"role": "user", "content": " ".join(["A"] * n)}]
    ours = len(t.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False))
    req = urllib.request.Request(f"http://127.0.0.1:{sys.argv[2]}/v1/chat/completions/input_tokens",
                                 data=json.dumps({"messages": msgs}).encode(),
                                 headers={"content-type": "application/json"})
    theirs = json.load(urllib.request.urlopen(req))["input_tokens"]
    assert ours == theirs, f"{n} x 'A': tokenizer export counts {ours}, llama-server {theirs}"
print("tokenizer export: chat-template counts equal llama-server's input_tokens")
EOF

# (4) the AISBench config: one service model, one synthetic string dataset ("A A A ..." of sampled length)
cat >"$work/perf_llamacpp.py" <<EOF
from ais_bench.benchmark.calculators import DefaultPerfMetricCalculator
from ais_bench.benchmark.datasets import MATHEvaluator, SyntheticDataset, math_postprocess_v2
from ais_bench.benchmark.models import VLLMCustomAPIChat
from ais_bench.benchmark.openicl.icl_inferencer import GenInferencer
from ais_bench.benchmark.openicl.icl_prompt_template import PromptTemplate
from ais_bench.benchmark.openicl.icl_retriever import ZeroRetriever
from ais_bench.benchmark.summarizers import DefaultPerfSummarizer

models = [dict(
    attr="service", type=VLLMCustomAPIChat, abbr="llamacpp-gemma3-270m",
    path="$tok", model="gemma-3-270m", stream=True, request_rate=0, use_timestamp=False,
    retry=1,  # attempts: 0 would send nothing
    api_key="", host_ip="127.0.0.1", host_port=$port, url="", max_out_len=8, batch_size=$concurrency,
    trust_remote_code=False,
    # identical synthetic prompts would hit the prefix cache: cold prefill for every request
    generation_kwargs=dict(temperature=0, ignore_eos=True, cache_prompt=False),
)]
synthetic_config = {
    "Type": "string", "RequestCount": $requests, "TrustRemoteCode": False,
    "StringConfig": {
        "Input": {"Method": "uniform", "Params": {"MinValue": 24, "MaxValue": 96}},
        "Output": {"Method": "uniform", "Params": {"MinValue": 8, "MaxValue": 8}},
    },
}
datasets = [dict(
    abbr="synthetic", type=SyntheticDataset, config=synthetic_config,
    reader_cfg=dict(input_columns=["question", "max_out_len"], output_column="answer"),
    infer_cfg=dict(prompt_template=dict(type=PromptTemplate, template="{question}"),
                   retriever=dict(type=ZeroRetriever), inferencer=dict(type=GenInferencer)),
    eval_cfg=dict(evaluator=dict(type=MATHEvaluator, version="v2"), pred_postprocessor=dict(type=math_postprocess_v2)),
)]
summarizer = dict(attr="performance", type=DefaultPerfSummarizer, calculator=dict(
    type=DefaultPerfMetricCalculator, stats_list=["Average", "Min", "Max", "Median", "P75", "P90", "P99"]))
EOF
(cd "$work" && "$venv/bin/ais_bench" perf_llamacpp.py --mode perf --num-warmups 1 -w "$work/out" \
  >"$work/ais_bench.log" 2>&1) || { tail -40 "$work/ais_bench.log" >&2; exit 1; }
details="$(find "$work/out" -name '*_details.jsonl' -path '*performances*' | head -1)"
[ -n "$details" ] || { tail -40 "$work/ais_bench.log" >&2; echo "no performances/*/ in $work/out" >&2; exit 1; }
perf="$(dirname "$details")"
stamp="$(basename "$(dirname "$(dirname "$perf")")")"

# (5) keep the perf output only (details, timing database, summaries), once per calculator:
# total/ = DefaultPerfMetricCalculator (whole run), stable/ = StablePerfMetricCalculator (stable stage),
# the second summarized from the same requests (--reuse: nothing is sent again)
keep() {
  mkdir -p "$out/$1/db_data"
  cp "$perf"/*_details.jsonl "$perf"/*.csv "$perf"/*.json "$out/$1/"
  cp "$perf"/db_data/*.db "$out/$1/db_data/"
}
rm -rf "$out"
keep total
sed -e 's/DefaultPerfMetricCalculator/StablePerfMetricCalculator/g' "$work/perf_llamacpp.py" >"$work/perf_llamacpp_stable.py"
(cd "$work" && "$venv/bin/ais_bench" perf_llamacpp_stable.py --mode perf -r "$stamp" -w "$work/out" \
  >"$work/ais_bench_stable.log" 2>&1) || { tail -40 "$work/ais_bench_stable.log" >&2; exit 1; }
keep stable
cat >"$out/SOURCE.md" <<EOF
# AISBench perf output (test data)

Generated by bench/aisbench/generate.sh: ais-bench-benchmark $aisv, --mode perf, $requests requests,
batch_size (concurrency) $concurrency, synthetic string prompts of 24-96 'A's, 8 output tokens (ignore_eos),
stream, cache_prompt=false, against llama-server (Gemma 3 270M Q4_K_M, -c 4096 -np 4 -t 2) on loopback.
Model path (tokenizer): Gemma's tokenizer exported from the gguf with the server's ChatML fallback template.
total/: summarized by DefaultPerfMetricCalculator; stable/: the same requests summarized by
StablePerfMetricCalculator (ais_bench --mode perf --reuse). Each is a performances/<model_abbr>/ directory.
EOF
du -sh "$out"
echo "wrote $out"
