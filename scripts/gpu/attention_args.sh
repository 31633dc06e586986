# Sourced by the attention verbs (attention-vs-torch.sh, attention-bwd.sh): their shared
# arguments, BUILD_DIR [64|128]...
# attention_args VERB "$@" sets BUILD and dims (default 128 64), or exits 2 saying what is wrong.
attention_args() {
  local verb=$1 d
  shift
  BUILD=${1:?usage: scripts/gpu.sh $verb BUILD_DIR [64|128]...}
  shift
  dims=("$@")
  [ ${#dims[@]} -eq 0 ] && dims=(128 64)
  for d in "${dims[@]}"; do
    case $d in
      64 | 128) ;;
      *) echo "$verb: head dimension '$d': the rows are D 64 and D 128" >&2; exit 2 ;;
    esac
  done
  [ -x "$BUILD/bin/bench_cuda_kernels" ] ||
    { echo "$verb: no $BUILD/bin/bench_cuda_kernels (scripts/gpu.sh unpack)" >&2; exit 2; }
}
