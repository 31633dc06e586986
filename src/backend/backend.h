// The Backend interface: memory, streams, events and every op a decoder layer needs.
//
// Two implementations: backend/host (fp32 reference, runs everywhere, synchronous) and
// backend/cuda (bf16 storage, fp32 accumulation, asynchronous on streams). Model recipes and
// the engine are written once against this interface.
//
// Conventions for every op:
//  - All Mats are row-major views (see tensor.h); "[T,C]" names rows x cols.
//  - Activations and weights use compute_dtype() (f32 on host, bf16 on CUDA); gradients of
//    weights ("dw", "dbias", "dtable") and statistics (rstd, lse, loss) are always f32.
//  - "overwrite" outputs are fully written; "accumulate" outputs get += (zero them first).
//  - Integer inputs (ids, labels, positions, cu_seqlens) are int32 arrays in backend memory.
//  - Ops are enqueued on the given stream; the host backend runs them immediately.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "backend/tensor.h"
#include "optim/adamw_step.h"  // AdamWStep: the Backend's AdamW op takes optim's step
#include "optim/state_format.h"  // UnitStateView: the compact-state AdamW op's state

namespace sf {

enum class BackendKind { host, cuda };

// Owned backend memory. Freed by the backend that made it.
class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual void* data() const = 0;
  virtual size_t bytes() const = 0;
};

class Stream {
 public:
  virtual ~Stream() = default;
  virtual void synchronize() = 0;  // wait on the host until all enqueued work is done
};

class Event {
 public:
  virtual ~Event() = default;
  virtual void record(Stream& s) = 0;   // marks the current end of s
  virtual void wait(Stream& s) = 0;     // s waits (device side) for the recorded point
  virtual void synchronize() = 0;       // host waits for the recorded point
  virtual bool query() = 0;             // true when the recorded work is done
  // Seconds from `start`'s recorded point to this one's, both complete; only for events from
  // create_timing_event(). < 0: not measurable.
  virtual double seconds_since(Event& start) { (void)start; return -1; }
};

enum class Trans : uint8_t { no, yes };

// Causal grouped-query attention over packed sequences: token t of the flat batch belongs
// to the sequence s with cu_seqlens[s] <= t < cu_seqlens[s+1], and attends only to tokens
// of s at positions <= its own.
struct AttentionShape {
  int n_heads = 0;      // query heads
  int n_kv_heads = 0;   // key/value heads; n_heads % n_kv_heads == 0
  int head_dim = 0;
  float scale = 0.f;    // usually 1/sqrt(head_dim)
  int n_seqs = 0;       // sequences in cu_seqlens
  int max_seqlen = 0;   // longest sequence (for kernel launch sizing)
  // The same cu_seqlens on the host (n_seqs + 1 entries), where the caller has them; read only
  // during the call. The cuDNN path groups the sequences of a call by length with them (its
  // graphs pad each sequence to the longest of its group); null: it knows only max_seqlen.
  const int32_t* host_cu_seqlens = nullptr;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual BackendKind kind() const = 0;
  virtual std::string name() const = 0;
  virtual DType compute_dtype() const = 0;

  // ---- memory ------------------------------------------------------------------------
  // Throws Error(out_of_memory) naming `what` when the allocation fails.
  virtual std::unique_ptr<Buffer> alloc(size_t bytes, const std::string& what) = 0;
  // Host memory that copies to/from this backend can use asynchronously (pinned on CUDA).
  // Default: ordinary aligned host memory, not counted in bytes_in_use().
  virtual std::unique_ptr<Buffer> alloc_host(size_t bytes, const std::string& what);
  // Lets this backend's ops read existing host memory [p, p + bytes) that the caller owns
  // (e.g. a table an op gathers rows from over PCIe instead of staging it). The returned
  // Buffer's data() is the pointer to pass to ops; the mapping lasts as long as the Buffer,
  // which must go before the memory. Default (host memory is the backend's): p itself.
  virtual std::unique_ptr<Buffer> map_host(void* p, size_t bytes, const std::string& what);
  virtual size_t bytes_in_use() const = 0;
  virtual size_t peak_bytes_in_use() const = 0;
  // Bytes in use on the device by anyone, as its driver counts them (on CUDA cudaMemGetInfo's
  // total - free: beyond bytes_in_use() the CUDA context, libraries' own memory and other
  // processes); 0 where the backend has no device memory of its own (the host backend).
  virtual size_t device_used_bytes() const { return 0; }
  // What this backend spent once, on its own, in this process, that the run's summary should
  // name because it makes the first steps slower than the rest (on CUDA: the time cuDNN took
  // to build its attention plans); empty when there is nothing to say.
  virtual std::string one_off_costs() const { return {}; }
  // Copies between host memory and backend memory, ordered on stream s.
  virtual void copy_to_device(Stream& s, void* dst, const void* src, size_t bytes) = 0;
  virtual void copy_to_host(Stream& s, void* dst, const void* src, size_t bytes) = 0;
  virtual void copy_on_device(Stream& s, void* dst, const void* src, size_t bytes) = 0;
  virtual void fill_zero(Stream& s, void* dst, size_t bytes) = 0;

  // ---- streams and events -----------------------------------------------------------
  virtual std::unique_ptr<Stream> create_stream(const std::string& name) = 0;
  virtual std::unique_ptr<Event> create_event() = 0;
  // An event that can measure device time (seconds_since); null where the backend cannot.
  virtual std::unique_ptr<Event> create_timing_event() { return nullptr; }
  // A named range on the host timeline around what is enqueued inside it (NVTX on CUDA, so
  // that Nsight Systems shows each layer and chunk); ranges nest. No-ops where nothing
  // records them; annotates() says whether a name is worth formatting.
  virtual bool annotates() const { return false; }
  virtual void range_push(const char* name) {}
  virtual void range_pop() {}
  virtual Stream& default_stream() = 0;

  // ---- GEMM ---------------------------------------------------------------------------
  // c = alpha * op(a) @ op(b) + beta * c, with op(x) = x or x^T (row-major semantics).
  // a, b in compute dtype; c in compute dtype or f32 (f32 for weight-gradient accumulation).
  virtual void gemm(Stream& s, Mat c, Mat a, Trans ta, Mat b, Trans tb, float alpha,
                    float beta) = 0;
  // x[T,N] += bias[1,N] (overwrite of x in place).
  virtual void bias_add(Stream& s, Mat x, Mat bias) = 0;
  // dbias[1,N] (f32, accumulate) += column sums of dy[T,N].
  virtual void bias_backward(Stream& s, Mat dbias, Mat dy) = 0;

  // ---- embedding ----------------------------------------------------------------------
  // out[T,C] (overwrite) = table[ids[t], :]. table is in compute dtype or f32 (then each
  // element is rounded once to out's dtype) and may be host memory passed through map_host.
  virtual void embedding_forward(Stream& s, Mat out, const int32_t* ids, Mat table) = 0;
  // dtable[V,C] (f32, accumulate) [ids[t], :] += dout[t, :], tokens in order; tokens with
  // ids[t] < 0 are skipped (a scatter into a block of a table's rows).
  virtual void embedding_backward(Stream& s, Mat dtable, const int32_t* ids, Mat dout) = 0;

  // ---- RMSNorm -----------------------------------------------------------------------
  // out = x * rstd * w, rstd[t] = 1/sqrt(mean(x[t]^2) + eps) (f32, overwrite, may be null).
  // Per-head norms (Qwen3 q_norm/k_norm) pass x as [T*H, D] views.
  virtual void rmsnorm_forward(Stream& s, Mat out, float* rstd, Mat x, Mat w, float eps) = 0;
  // Fused residual: sum = a + b (overwrite), out = rmsnorm(sum).
  virtual void add_rmsnorm_forward(Stream& s, Mat sum, Mat out, float* rstd, Mat a, Mat b,
                                   Mat w, float eps) = 0;
  // dx (overwrite) = d(rmsnorm)/dx^T dout + (dres if non-empty: the residual branch);
  // dw[1,C] (f32, accumulate) += sum_t dout * x * rstd. dx may alias dres.
  virtual void rmsnorm_backward(Stream& s, Mat dx, Mat dw, Mat dout, Mat x, Mat w,
                                const float* rstd, Mat dres) = 0;

  // ---- RoPE (rotate-half convention of Hugging Face) -----------------------------------
  // In place on x[T, H*D] (may be strided): for each head and i < D/2, angle =
  // pos[t] * inv_freq[i], (x_i, x_{i+D/2}) rotated by +angle (forward) or -angle (backward).
  // inv_freq is f32 [D/2] in backend memory (already includes llama3 scaling).
  virtual void rope_forward(Stream& s, Mat x, int n_heads, int head_dim, const int32_t* pos,
                            const float* inv_freq) = 0;
  virtual void rope_backward(Stream& s, Mat dx, int n_heads, int head_dim,
                             const int32_t* pos, const float* inv_freq) = 0;

  // ---- attention -------------------------------------------------------------------------
  // out[T, Hq*D] (overwrite), lse[Hq, T] (f32, overwrite: log-sum-exp of scaled scores).
  virtual void attention_forward(Stream& s, Mat out, float* lse, Mat q, Mat k, Mat v,
                                 const AttentionShape& shape, const int32_t* cu_seqlens) = 0;
  // dq, dk, dv (overwrite) from dout, the forward's out and lse.
  virtual void attention_backward(Stream& s, Mat dq, Mat dk, Mat dv, Mat dout, Mat out,
                                  const float* lse, Mat q, Mat k, Mat v,
                                  const AttentionShape& shape, const int32_t* cu_seqlens) = 0;

  // Generation with a KV cache: causal GQA of the q_len newest tokens of ONE sequence over a
  // cache that already holds them. Cache rows [0, kv_len) are the sequence's keys / values in
  // position order (the new tokens are rows kv_len - q_len .. kv_len - 1), and new token i
  // attends to rows [0, kv_len - q_len + i]. q [q_len, Hq*D]; k_cache, v_cache [>= kv_len,
  // Hkv*D] (rows past kv_len are never read); out [q_len, Hq*D] (overwrite). shape.n_seqs and
  // max_seqlen are unused. No statistics: this is inference only.
  virtual void attention_decode(Stream& s, Mat out, Mat q, Mat k_cache, Mat v_cache,
                                const AttentionShape& shape, int64_t kv_len) = 0;

  // ---- SwiGLU ---------------------------------------------------------------------------
  // out[T,F] (overwrite) = silu(gate) * up.
  virtual void swiglu_forward(Stream& s, Mat out, Mat gate, Mat up) = 0;
  // dgate, dup (overwrite); they may alias gate, up.
  virtual void swiglu_backward(Stream& s, Mat dgate, Mat dup, Mat dout, Mat gate, Mat up) = 0;

  // ---- LM head + cross-entropy, fused and chunked over tokens ---------------------------
  // For each token t with labels[t] != -100: loss_t = logsumexp(h[t] W^T) - (h[t] W^T)[label].
  // loss_sum (f32 scalar in backend memory, accumulate) += sum_t loss_t.
  // If dh is non-empty: dh[T,C] (overwrite) = grad_scale * dL/dh; if dw is non-empty:
  // dw[V,C] (f32, accumulate) += grad_scale * dL/dW. Logits are formed scratch.rows tokens at
  // a time in scratch[chunk, V] (f32); the [T, V] logits are never materialised.
  virtual void lm_head_loss(Stream& s, float* loss_sum, Mat dh, Mat dw, Mat h, Mat w,
                            const int32_t* labels, float grad_scale, Mat scratch) = 0;

  // ---- elementwise, reductions, optimizer -----------------------------------------------
  // dst (overwrite) = src converted to dst.dtype (same shape).
  virtual void cast(Stream& s, Mat dst, Mat src) = 0;
  // dst += alpha * src (dst f32 or compute dtype; src any float type).
  virtual void axpy(Stream& s, Mat dst, Mat src, float alpha) = 0;
  // out (f32 scalar in backend memory, accumulate) += sum of squares of x.
  virtual void sum_squares(Stream& s, float* out, Mat x) = 0;
  // One AdamW step on n f32 parameters resident in backend memory; also writes a
  // compute-dtype copy of the new weights to `weights_out` if non-null.
  virtual void adamw(Stream& s, float* param, float* m, float* v, const float* grad,
                     void* weights_out, int64_t n, const AdamWStep& step) = 0;
  // One AdamW step on the window [off, off + len) of one unit's compact optimizer state
  // (optim/state_format.h) resident in backend memory, with the window rules and the
  // arithmetic of optim/state_adamw.h's adamw_update_state: bitwise the same state on every
  // backend. state.master / m / v / m_scale / v_scale, grad (f32, at the window's first
  // element) and weights_out are backend memory; state.layout and ranges (the unit's full
  // ranges) are host memory. weights_out (compute dtype, overwrite, at the window's first
  // element; may be null) receives the new weights: the bf16 bits adamw_update_state writes
  // to bf16_out on a bf16 backend, the (decoded) new master on the f32 host backend. The
  // host and CUDA backends implement it; a decorator must forward it.
  virtual void adamw_state(Stream& s, const UnitStateView& state, int64_t off, int64_t len,
                           const float* grad, void* weights_out,
                           std::span<const ParamRange> ranges, const AdamWStep& step) {
    (void)s, (void)state, (void)off, (void)len, (void)grad, (void)weights_out, (void)ranges,
        (void)step;
    SF_CHECK(false, "adamw_state (compact optimizer state) is not supported by backend ", name(),
             "; a decorating backend must forward it to the backend it wraps");
  }
};

}  // namespace sf
