# Sourced by engine.sh and engine-ab.sh (not a verb): one `slideformer bench` shape of an
# SF_BENCH line ("<size> <layers|0> <batch> <seq> <gpu-memory> [further bench flags]").

# bench_shape_name SIZE LAYERS BATCH SEQ MEM EXTRA: the shape's log name (no directory, no .log).
bench_shape_name() {
  local tag
  tag=$(echo "$6" | tr -c 'A-Za-z0-9\n' '_')
  echo "bench_${1}_${2}_${3}x${4}_${5}${tag:+_$tag}"
}

# bench_shape SLIDEFORMER LOG SIZE LAYERS BATCH SEQ MEM EXTRA: runs the shape into LOG (stdout
# and stderr); returns the run's exit status (124: past SF_BENCH_TIMEOUT, default 420 s).
# SF_BENCH_STEPS (default 12) steps, the first a warm-up.
bench_shape() {
  local sf=$1 log=$2 size=$3 layers=$4 batch=$5 seq=$6 mem=$7 extra=$8
  # shellcheck disable=SC2086  # extra: further bench flags, split on purpose
  timeout "${SF_BENCH_TIMEOUT:-420}" "$sf" bench --size "$size" --layers "$layers" --batch-size "$batch" \
    --seq-len "$seq" --steps "${SF_BENCH_STEPS:-12}" --gpu-memory "$mem" --backend cuda $extra > "$log" 2>&1
}
