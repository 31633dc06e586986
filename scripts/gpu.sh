#!/usr/bin/env bash
# The one entry point of the GPU tooling: scripts/gpu.sh <verb> [args]; `scripts/gpu.sh help`
# lists the verbs. `pack` runs here (no GPU needed), the others on the machine with the GPU.
# Each verb is a script of its own under scripts/gpu/, run in a bash of its own: its shell
# options (pack and unpack stop at the first error, the others run on and report), variables,
# traps and exit status stay its own, as they were when the verbs were separate scripts. Its
# header states its arguments, env variables and logs.
set -uo pipefail
here=$(dirname "$0")
verbs=(pack unpack check engine footprint train-check quality try ab engine-ab attention-vs-torch attention-bwd attention-profile sanitize)

# One line per verb: its arguments, then what it does.
summary() {
  case $1 in
    pack) echo "[commit]|build a commit's GPU binaries here (no GPU) into .carry/" ;;
    unpack) echo "[dir] [name]|lay out a carried pack as dir/{bin,tests}, print dir" ;;
    check) echo "[build-dir]|GPU test suite, kernel benchmarks, PyTorch, one layer" ;;
    engine) echo "[build-dir]|engine tests, saved models in transformers, bench SF_BENCH" ;;
    footprint) echo "[build-dir]|engine + decode tests, 8B at SlideFormer's footprints, decode speed" ;;
    train-check) echo "[slideformer]|train resident + sliding, Ctrl-C + resume, a larger preset" ;;
    quality) echo "BUILD GGUF DATA|compact state vs fp32: SmolLM2 fine-tuning + a 1B shape, one csv" ;;
    try) echo "A_PACK B_PACK|B's GPU tests, kernel A/B, one layer of each, one call" ;;
    ab) echo "A_DIR B_DIR [flags]|kernel benchmarks of two builds interleaved, B/A" ;;
    engine-ab) echo "A_DIR B_DIR|slideformer bench SF_BENCH of two builds interleaved" ;;
    attention-vs-torch) echo "BUILD [D...]|our attention (D 64, 128) against torch's fastest SDPA, interleaved" ;;
    attention-bwd) echo "BUILD [D...]|the one-pass backward: its test under memcheck, then our implementations vs torch cuDNN" ;;
    attention-profile) echo "BUILD D SEQ|ncu on one attention row's backward: ours, cuDNN's, FA3's" ;;
    sanitize) echo "BUILD [filter] [tool]|GPU tests under compute-sanitizer (carried wheel, .sanitizer/)" ;;
  esac
}

usage() {
  echo "usage: scripts/gpu.sh <verb> [args]"
  echo
  local v line
  for v in "${verbs[@]}"; do
    line=$(summary "$v")
    printf '  %-33s %s\n' "$v ${line%%|*}" "${line#*|}"
  done
  echo
  echo "A verb's arguments, env variables and logs: the header of scripts/gpu/<verb>.sh."
}

verb=${1:-}
case $verb in
  help | -h | --help) usage; exit 0 ;;
  "") usage >&2; exit 2 ;;
esac
shift
for v in "${verbs[@]}"; do
  [ "$v" = "$verb" ] && exec bash "$here/gpu/$verb.sh" "$@"
done
echo "scripts/gpu.sh: unknown verb '$verb' (scripts/gpu.sh help lists the verbs)" >&2
exit 2
