// cuDNN fused attention through the backend graph API (contract in cudnn_attention.h).
//
// Graph (the forward; K enters as K^T [B, Hkv, D, S], GQA by head broadcast in the matmuls):
//   S  = matmul(Q, K^T)          M, N overridden by seq_len (padding value 0)
//   S *= scale                   (by-value scalar)
//   S  = select(S, -inf, row < seq_len && col < seq_len)      padding mask
//   S  = select(S, -inf, row >= col)                          top-left causal mask
//   m  = max_row(S); E = exp(S - m); l = sum_row(E)
//   Stats = m + log(l)           [B, Hq, S, 1] f32, natural log (our lse, padded)
//   O  = matmul(E / l as bf16, V)
// Backward (dO . O and the dQ accumulator are non-virtual f32 tensors in our workspace):
//   sum  = rowsum(dO * O);  S as above but E = exp(scale*QK^T masked - Stats)
//   dV   = matmul(E^T as bf16, dO)            (GQA: [B, Hq, S, D] then a head reduction)
//   dS   = (matmul(dO, V^T) - sum) * E * scale
//   dK   = matmul(dS^T as bf16, Q)            (GQA: head reduction)
//   dQ   = identity(matmul(dS, K) into the f32 accumulator)
//          or, deterministic, matmul(dS, K) straight into dQ: the form cuDNN runs with an
//          engine that needs no atomics (NVIDIA's frontend builds it for is_deterministic).
// This is the op sequence cuDNN's SDPA pattern matcher accepts (the one NVIDIA's frontend
// emits for cuDNN 9.x before its unified SDPA node, which has no causal mask in 9.19).
#include "backend/cuda/cudnn_attention.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/cuda/attention.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cudnn_attention_aux.cuh"
#include "backend/cuda/cudnn_library.h"
#include "core/error.h"

namespace sf::cuda {

const char* attention_impl_name(AttentionImpl impl) {
  switch (impl) {
    case AttentionImpl::cudnn: return "cudnn";
    case AttentionImpl::split: return "split";
    default: return "native";
  }
}

AttentionImpl attention_impl_setting() {
  const char* e = std::getenv("SF_ATTN");
  const std::string want = e == nullptr ? "" : e;
  SF_REQUIRE(want.empty() || want == "native" || want == "cudnn" || want == "split", "SF_ATTN=",
             want, " is not an attention implementation: use native (slideformer's kernels), "
             "cudnn (cuDNN's) or split (slideformer's forward, cuDNN's backward)");
  if (want == "native") return AttentionImpl::native;
  const bool cudnn = cudnn_attention_available();
  SF_REQUIRE(want.empty() || cudnn, "SF_ATTN=", want, ", but cuDNN attention is unavailable: ",
             cudnn_attention_unavailable_reason(), ". Unset SF_ATTN (or SF_ATTN=native) to run "
             "slideformer's own attention kernels");
  SF_REQUIRE(!cudnn || want == "split" || ws_forward_setting() != WsForward::required,
             "SF_ATTN_WS=1 picks among slideformer's own attention kernels, but cuDNN runs "
             "attention here: add SF_ATTN=native (or SF_ATTN=split for the forward), or unset "
             "SF_ATTN_WS");
  if (!cudnn) return AttentionImpl::native;
  return want == "split" ? AttentionImpl::split : AttentionImpl::cudnn;
}

namespace {
std::atomic<int> g_impl{-1};  // -1: not decided yet, else an AttentionImpl
}  // namespace

AttentionImpl attention_impl() {
  int v = g_impl.load();
  if (v < 0) {
    v = int(attention_impl_setting());
    g_impl.store(v);
  }
  return AttentionImpl(v);
}

AttentionImpl set_attention_impl(AttentionImpl impl) {
  g_impl.store(int(impl != AttentionImpl::native && !cudnn_attention_available()
                       ? AttentionImpl::native
                       : impl));
  return attention_impl();
}

namespace {

// A 0/1 switch from the environment, read on first use; set() overrides it (tests, A/B
// benchmarks). Another value is an Error saying what 0 and 1 mean.
class EnvSwitch {
 public:
  constexpr EnvSwitch(const char* name, bool default_on, const char* meaning)
      : name_(name), default_on_(default_on), meaning_(meaning) {}
  bool get() {
    int v = value_.load();
    if (v < 0) {
      const char* e = std::getenv(name_);
      const std::string want = e == nullptr ? (default_on_ ? "1" : "0") : e;
      SF_REQUIRE(want == "0" || want == "1", name_, "=", want, " must be ", meaning_);
      v = want == "1" ? 1 : 0;
      value_.store(v);
    }
    return v == 1;
  }
  void set(bool on) { value_.store(on ? 1 : 0); }

 private:
  const char* name_;
  bool default_on_;
  const char* meaning_;
  std::atomic<int> value_{-1};  // -1: not read yet
};

EnvSwitch g_deterministic{"SF_ATTN_DETERMINISTIC", false,
                          "1 (attention backwards give the same bits every call) or 0 (cuDNN may use its "
                          "faster atomic-accumulating backward, the default)"};
EnvSwitch g_dense{"SF_CUDNN_DENSE", true,
                  "1 (a call whose sequences all fill their length bucket runs cuDNN's dense graph, "
                  "the default) or 0 (every call runs the packed graph)"};

}  // namespace

bool attention_deterministic() { return g_deterministic.get(); }
void set_attention_deterministic(bool on) { g_deterministic.set(on); }
bool cudnn_dense_graphs() { return g_dense.get(); }
void set_cudnn_dense_graphs(bool on) { g_dense.set(on); }

namespace {
std::atomic<PackedBatch> g_packed_batch{PackedBatch::by_count};
}  // namespace

PackedBatch cudnn_packed_batch() { return g_packed_batch.load(); }
void set_cudnn_packed_batch(PackedBatch p) { g_packed_batch.store(p); }

namespace {

// "" where device 0 is compute capability 9.x, else why not.
std::string device_problem() {
  int dev = 0, major = 0, minor = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  if (e != cudaSuccess) {
    cudaGetLastError();  // (not left for a later launch check to find)
    return cat("no CUDA device (", cudaGetErrorString(e), ")");
  }
  if (major != 9)
    return cat("device ", dev, " is compute capability ", major, ".", minor,
               "; the cuDNN graphs here are built for 9.x (Hopper)");
  return "";
}

// Why the cuDNN path cannot run, decided once. A device it cannot serve needs no library (and
// no note) unless SF_CUDNN_LIB names one, which is then checked anyway (an Error if bad). Where
// only the library is missing, one note on stderr, unless SF_ATTN=cudnn (or split) turns it into
// an Error.
const std::string& unavailable_reason() {
  static const std::string why = [] {
    const std::string dev = device_problem();
    const char* lib = std::getenv("SF_CUDNN_LIB");
    if (!dev.empty() && (lib == nullptr || *lib == 0)) return dev;
    const CudnnLibraryInfo info = cudnn_library_info();
    if (!dev.empty() || info.loaded) return dev;
    if (!cudnn_attention_built())
      return cat(info.why, ": rebuild with cuDNN 9's headers (>= 9.6) in the CUDA toolkit");
    const char* attn = std::getenv("SF_ATTN");  // (cudnn and split make it an Error instead)
    if (attn == nullptr || (std::string(attn) != "cudnn" && std::string(attn) != "split"))
      std::fprintf(stderr, "%s\n", cudnn_unavailable_note(info).c_str());
    return cat("cuDNN is not loaded (", info.why, "): set SF_CUDNN_LIB=/path/to/libcudnn.so.9 "
               "or install cuDNN 9");
  }();
  return why;
}

}  // namespace

bool cudnn_attention_available() { return unavailable_reason().empty(); }
std::string cudnn_attention_unavailable_reason() { return unavailable_reason(); }

std::string describe_plan_building(const CudnnAttentionStats& st) {
  if (st.plans_built <= 0) return {};
  char secs[32];
  std::snprintf(secs, sizeof secs, "%.1f", st.plan_build_seconds);
  return cat("cuDNN built ", st.plans_built, " attention plan", st.plans_built == 1 ? "" : "s",
             " in ", secs, " s (once per shape, the first time it runs)");
}

#if !SF_WITH_CUDNN

// Built without cuDNN >= 9.6 headers (CMake found none): the native kernels are the only ones.
bool cudnn_attention_built() { return false; }
std::string cudnn_attention_graph_check(const CudnnAttentionCall&) {
  return "this build has no cuDNN >= 9.6";
}
size_t cudnn_attention_workspace_bytes(const CudnnAttentionCall&) { return 0; }
size_t cudnn_attention_workspace_bytes(const AttentionShape&, const AttentionStrides&, bool) {
  return 0;
}
bool cudnn_attention_run(cudaStream_t, const CudnnAttentionCall&, void*, size_t) {
  return false;
}
CudnnAttentionStats cudnn_attention_stats() { return {}; }
std::string cudnn_attention_plan_info(const CudnnAttentionCall&) {
  return "this build has no cuDNN >= 9.6";
}

#else

namespace {

// The loaded library's functions: only called once cudnn_attention_available() or the graph
// check found it loaded.
const CudnnApi& dnn() {
  const CudnnApi* api = cudnn_api();
  SF_CHECK(api != nullptr, "cuda cudnn attention: cuDNN called without a loaded library");
  return *api;
}

// ---- errors ------------------------------------------------------------------------------------

// A failure while building a plan: the shape is refused and the native kernels run it.
struct Refusal : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string status_text(cudnnStatus_t st) {
  char last[1024] = {0};
  dnn().cudnnGetLastErrorString(last, sizeof(last));
  return cat(dnn().cudnnGetErrorString(st), " (", int(st), ")", last[0] ? ": " : "", last);
}

[[noreturn]] void refuse(const std::string& where, cudnnStatus_t st) {
  throw Refusal(cat(where, ": ", status_text(st)));
}

// ---- descriptors -------------------------------------------------------------------------------

// One backend descriptor, named for error messages ("tensor Q", "op bmm1", ...).
class Desc {
 public:
  Desc(cudnnBackendDescriptorType_t type, std::string name) : name_(std::move(name)) {
    const cudnnStatus_t st = dnn().cudnnBackendCreateDescriptor(type, &d_);
    if (st != CUDNN_STATUS_SUCCESS) refuse(cat("create ", name_), st);
  }
  ~Desc() {
    if (d_ != nullptr) dnn().cudnnBackendDestroyDescriptor(d_);
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  Desc(Desc&& o) noexcept : d_(std::exchange(o.d_, nullptr)), name_(std::move(o.name_)) {}

  cudnnBackendDescriptor_t get() const { return d_; }
  const std::string& name() const { return name_; }

  void set(cudnnBackendAttributeName_t attr, const char* attr_name,
           cudnnBackendAttributeType_t type, int64_t n, const void* value) {
    const cudnnStatus_t st = dnn().cudnnBackendSetAttribute(d_, attr, type, n, value);
    if (st != CUDNN_STATUS_SUCCESS) refuse(cat(name_, " set ", attr_name), st);
  }
  void set_desc(cudnnBackendAttributeName_t attr, const char* attr_name, const Desc& other) {
    cudnnBackendDescriptor_t o = other.get();
    set(attr, attr_name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &o);
  }
  void finalize() {
    const cudnnStatus_t st = dnn().cudnnBackendFinalize(d_);
    if (st != CUDNN_STATUS_SUCCESS) refuse(cat(name_, " finalize"), st);
  }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
  std::string name_;
};

#define SF_SET(desc, attr, type, n, value) (desc).set(attr, #attr, type, n, value)
#define SF_SET_DESC(desc, attr, other) (desc).set_desc(attr, #attr, other)

// ---- the graph ---------------------------------------------------------------------------------

using Dims = std::array<int64_t, 4>;

// Unique ids of the tensors the variant pack binds.
enum Uid : int64_t {
  kQ = 1, kK, kV, kO, kStats, kScale, kSeqQ, kSeqKv, kNegInfPad, kNegInfCausal, kOne,
  kDO, kDQ, kDK, kDV, kSoftmaxSum, kDQAccum,
  kOffQ, kOffK, kOffV, kOffO, kOffDO, kOffDQ, kOffDK, kOffDV,
  kFirstVirtual = 1000
};

// What a plan fixes (the plan cache key).
struct GraphKey {
  bool backward = false;
  bool deterministic = false;  // backward only
  // Sequences that all fill the bucket (B of them exactly, each S long, row b * S on): the
  // graph has no ragged offsets, no sequence-length overrides and no padding mask (the form
  // PyTorch's dense SDPA builds).
  bool dense = false;
  int device = 0;
  int B = 0, S = 0, hq = 0, hkv = 0, d = 0;
  int64_t ldq = 0, ldk = 0, ldv = 0, ldo = 0, lddo = 0, lddq = 0, lddk = 0, lddv = 0;
  auto tie() const {
    return std::tie(backward, deterministic, dense, device, B, S, hq, hkv, d, ldq, ldk, ldv, ldo, lddo, lddq,
                    lddk, lddv);
  }
  bool operator<(const GraphKey& o) const { return tie() < o.tie(); }
};

// Tensors and operations of one graph, in creation order (the op graph keeps pointers to the
// descriptors, so they live as long as the plan).
class Graph {
 public:
  explicit Graph(const GraphKey& k) : key_(k) {}

  const Desc& tensor(const char* name, cudnnDataType_t dt, const Dims& dims, const Dims& strides,
                     int64_t uid, bool is_virtual = false, bool by_value = false,
                     const Desc* ragged = nullptr) {
    Desc t(CUDNN_BACKEND_TENSOR_DESCRIPTOR, cat("tensor ", name));
    SF_SET(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt);
    SF_SET(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data());
    SF_SET(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data());
    SF_SET(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    const int64_t align = 16;
    SF_SET(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    const bool v = is_virtual, bv = by_value;
    SF_SET(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &v);
    if (by_value) SF_SET(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &bv);
    if (ragged != nullptr) SF_SET_DESC(t, CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC, *ragged);
    t.finalize();
    tensors_.push_back(std::make_unique<Desc>(std::move(t)));
    return *tensors_.back();
  }
  const Desc& virt(const char* name, cudnnDataType_t dt, const Dims& dims, const Dims& strides,
                   const Desc* ragged = nullptr) {
    return tensor(name, dt, dims, strides, next_virtual_++, true, false, ragged);
  }
  const Desc& scalar(const char* name, int64_t uid) {
    return tensor(name, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, uid, false, true);
  }

  // y = mode(x[, b[, t]]); axis >= 0 for GEN_INDEX.
  void pointwise(const char* name, cudnnPointwiseMode_t mode, const Desc& x, const Desc* b,
                 const Desc* t, const Desc& y, cudnnDataType_t prec = CUDNN_DATA_FLOAT,
                 int64_t axis = -1) {
    Desc pw(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, cat("pointwise desc ", name));
    SF_SET(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    SF_SET(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    if (axis >= 0) SF_SET(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    pw.finalize();
    Desc op(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, cat("op ", name));
    SF_SET_DESC(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
    SF_SET_DESC(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
    if (b != nullptr) SF_SET_DESC(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b);
    if (t != nullptr) SF_SET_DESC(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, *t);
    SF_SET_DESC(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
    const float one = 1.f;
    SF_SET(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one);
    SF_SET(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one);
    op.finalize();
    keep(std::move(pw));
    ops_.push_back(std::make_unique<Desc>(std::move(op)));
  }

  void reduction(const char* name, cudnnReduceTensorOp_t red, const Desc& x, const Desc& y) {
    Desc rd(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, cat("reduction desc ", name));
    const cudnnDataType_t f = CUDNN_DATA_FLOAT;
    SF_SET(rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &red);
    SF_SET(rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f);
    rd.finalize();
    Desc op(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, cat("op ", name));
    SF_SET_DESC(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x);
    SF_SET_DESC(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y);
    SF_SET_DESC(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, rd);
    op.finalize();
    keep(std::move(rd));
    ops_.push_back(std::make_unique<Desc>(std::move(op)));
  }

  // c = a @ b over the last two dims; m/n/k: the per-sequence GEMM sizes (seq_len tensors).
  void matmul(const char* name, const Desc& a, const Desc& b, const Desc& c, const Desc* m,
              const Desc* n, const Desc* k, bool pad_zero = false) {
    Desc md(CUDNN_BACKEND_MATMUL_DESCRIPTOR, cat("matmul desc ", name));
    const cudnnDataType_t f = CUDNN_DATA_FLOAT;
    SF_SET(md, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f);
    if (pad_zero) {
      const double zero = 0.0;
      SF_SET(md, CUDNN_ATTR_MATMUL_PADDING_VALUE, CUDNN_TYPE_DOUBLE, 1, &zero);
    }
    md.finalize();
    Desc op(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, cat("op ", name));
    SF_SET_DESC(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a);
    SF_SET_DESC(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b);
    SF_SET_DESC(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c);
    SF_SET_DESC(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, md);
    if (m != nullptr) SF_SET_DESC(op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC, *m);
    if (n != nullptr) SF_SET_DESC(op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC, *n);
    if (k != nullptr) SF_SET_DESC(op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC, *k);
    op.finalize();
    keep(std::move(md));
    ops_.push_back(std::make_unique<Desc>(std::move(op)));
  }

  void reshape(const char* name, const Desc& x, const Desc& y) {
    Desc op(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, cat("op ", name));
    SF_SET_DESC(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x);
    SF_SET_DESC(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y);
    op.finalize();
    ops_.push_back(std::make_unique<Desc>(std::move(op)));
  }

  Desc finish(cudnnHandle_t handle) {
    Desc g(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, key_.backward ? "backward op graph"
                                                                  : "forward op graph");
    std::vector<cudnnBackendDescriptor_t> ops;
    for (const auto& o : ops_) ops.push_back(o->get());
    SF_SET(g, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, int64_t(ops.size()),
           ops.data());
    if (handle != nullptr)  // optional since cuDNN 9.8 (graphs checked without a device)
      SF_SET(g, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    g.finalize();
    return g;
  }

  const GraphKey& key() const { return key_; }

 private:
  void keep(Desc&& d) { aux_.push_back(std::make_unique<Desc>(std::move(d))); }

  GraphKey key_;
  int64_t next_virtual_ = kFirstVirtual;
  std::vector<std::unique_ptr<Desc>> tensors_, aux_, ops_;
};

// Shapes of the graph's tensors (THD with ragged offsets; the batch stride of a ragged tensor
// is never used, it is the padded one).
struct Shapes {
  int64_t B, S, hq, hkv, d;
  Dims score() const { return {B, hq, S, S}; }
  Dims score_stride() const { return {hq * S * S, S * S, S, 1}; }
  Dims score_t_stride() const { return {hq * S * S, S * S, 1, S}; }  // the transpose's view
  Dims row() const { return {B, hq, S, 1}; }
  Dims row_stride() const { return {hq * S, S, 1, 1}; }
  Dims bhsd(int64_t h) const { return {B, h, S, d}; }
  Dims bhsd_stride(int64_t h) const { return {h * S * d, S * d, d, 1}; }
  Dims thd_stride(int64_t ld) const { return {S * ld, d, ld, 1}; }  // [T, H*D] rows of ld
  Dims bhds(int64_t h) const { return {B, h, d, S}; }                 // a transposed view
  Dims thd_t_stride(int64_t ld) const { return {S * ld, d, 1, ld}; }
};

// The tensors both directions share: sequence lengths, scalars.
struct Common {
  const Desc* seq_q;
  const Desc* seq_kv;
  const Desc* scale;
};

// A dense graph has no sequence lengths (null): nothing is padded.
Common common_tensors(Graph& g, const Shapes& sh, bool dense) {
  const Dims bdims{sh.B, 1, 1, 1}, ones{1, 1, 1, 1};
  Common c{};
  if (!dense) {
    c.seq_q = &g.tensor("seq_len_q", CUDNN_DATA_INT32, bdims, ones, kSeqQ);
    c.seq_kv = &g.tensor("seq_len_kv", CUDNN_DATA_INT32, bdims, ones, kSeqKv);
  }
  c.scale = &g.scalar("attn_scale", kScale);
  return c;
}

// A tensor's per-sequence row offsets, or null in a dense graph (sequence b starts at row b * S,
// the batch stride).
const Desc* ragged_offset(Graph& g, const char* name, const Shapes& sh, int64_t uid, bool dense) {
  if (dense) return nullptr;
  return &g.tensor(name, CUDNN_DATA_INT64, {sh.B + 1, 1, 1, 1}, {1, 1, 1, 1}, uid);
}

// Padding: keep row < seq_len_q and col < seq_len_kv.
const Desc& padding_masked(Graph& g, const Shapes& sh, const Common& c, const Desc& s2) {
  const Dims sd = sh.score(), ss = sh.score_stride();

  const Desc& prow = g.virt("pad_row", CUDNN_DATA_INT32, sd, ss);
  g.pointwise("gen_row_pad", CUDNN_POINTWISE_GEN_INDEX, s2, nullptr, nullptr, prow,
              CUDNN_DATA_INT32, 2);
  const Desc& pcol = g.virt("pad_col", CUDNN_DATA_INT32, sd, ss);
  g.pointwise("gen_col_pad", CUDNN_POINTWISE_GEN_INDEX, s2, nullptr, nullptr, pcol,
              CUDNN_DATA_INT32, 3);
  const Desc& rin = g.virt("row_in", CUDNN_DATA_BOOLEAN, sd, ss);
  g.pointwise("lt_row_seq", CUDNN_POINTWISE_CMP_LT, prow, c.seq_q, nullptr, rin,
              CUDNN_DATA_BOOLEAN);
  const Desc& cin = g.virt("col_in", CUDNN_DATA_BOOLEAN, sd, ss);
  g.pointwise("lt_col_seq", CUDNN_POINTWISE_CMP_LT, pcol, c.seq_kv, nullptr, cin,
              CUDNN_DATA_BOOLEAN);
  const Desc& inside = g.virt("inside", CUDNN_DATA_BOOLEAN, sd, ss);
  g.pointwise("and_row_col", CUDNN_POINTWISE_LOGICAL_AND, rin, &cin, nullptr, inside,
              CUDNN_DATA_BOOLEAN);
  const Desc& ninf_pad = g.scalar("neg_inf_padding", kNegInfPad);
  const Desc& s3 = g.virt("S_padded", CUDNN_DATA_FLOAT, sd, ss);
  g.pointwise("select_padding", CUDNN_POINTWISE_BINARY_SELECT, s2, &ninf_pad, &inside, s3);
  return s3;
}

// Causal, top-left: keep row >= col.
const Desc& causal_masked(Graph& g, const Shapes& sh, const Desc& last) {
  const Dims sd = sh.score(), ss = sh.score_stride();
  const Desc& crow = g.virt("causal_row", CUDNN_DATA_INT32, sd, ss);
  g.pointwise("gen_row_causal", CUDNN_POINTWISE_GEN_INDEX, last, nullptr, nullptr, crow,
              CUDNN_DATA_FLOAT, 2);
  const Desc& ccol = g.virt("causal_col", CUDNN_DATA_INT32, sd, ss);
  g.pointwise("gen_col_causal", CUDNN_POINTWISE_GEN_INDEX, last, nullptr, nullptr, ccol,
              CUDNN_DATA_FLOAT, 3);
  const Desc& keep = g.virt("causal_keep", CUDNN_DATA_BOOLEAN, sd, ss);
  g.pointwise("ge_row_col", CUDNN_POINTWISE_CMP_GE, crow, &ccol, nullptr, keep,
              CUDNN_DATA_BOOLEAN);
  const Desc& ninf_c = g.scalar("neg_inf_causal", kNegInfCausal);
  const Desc& out = g.virt("S_masked", CUDNN_DATA_FLOAT, sd, ss);
  g.pointwise("select_causal", CUDNN_POINTWISE_BINARY_SELECT, last, &ninf_c, &keep, out);
  return out;
}

// scores (scaled, padding-masked unless dense, causal-masked) of matmul(Q, K^T); returns the
// last tensor.
const Desc& masked_scores(Graph& g, const Shapes& sh, const Common& c, const Desc& q,
                          const Desc& kt, bool pad_zero, const Desc* subtract_stats) {
  const Dims sd = sh.score(), ss = sh.score_stride();
  const Desc& s1 = g.virt("S", CUDNN_DATA_FLOAT, sd, ss);
  g.matmul("bmm_q_kt", q, kt, s1, c.seq_q, c.seq_kv, nullptr, pad_zero && c.seq_q != nullptr);
  const Desc& s2 = g.virt("S_scaled", CUDNN_DATA_FLOAT, sd, ss);
  g.pointwise("mul_scale", CUDNN_POINTWISE_MUL, s1, c.scale, nullptr, s2);
  const Desc* last = c.seq_q != nullptr ? &padding_masked(g, sh, c, s2) : &s2;
  if (subtract_stats != nullptr) {  // the backward subtracts the statistics before masking
    const Desc& s4 = g.virt("S_minus_stats", CUDNN_DATA_FLOAT, sd, ss);
    g.pointwise("sub_stats", CUDNN_POINTWISE_SUB, *last, subtract_stats, nullptr, s4);
    last = &s4;
  }
  return causal_masked(g, sh, *last);
}

void build_forward(Graph& g) {
  const GraphKey& k = g.key();
  const Shapes sh{k.B, k.S, k.hq, k.hkv, k.d};
  const Common c = common_tensors(g, sh, k.dense);
  const Desc* oq = ragged_offset(g, "ragged_offset_q", sh, kOffQ, k.dense);
  const Desc* ok = ragged_offset(g, "ragged_offset_k", sh, kOffK, k.dense);
  const Desc* ov = ragged_offset(g, "ragged_offset_v", sh, kOffV, k.dense);
  const Desc* oo = ragged_offset(g, "ragged_offset_o", sh, kOffO, k.dense);
  const Desc& q = g.tensor("Q", CUDNN_DATA_BFLOAT16, sh.bhsd(sh.hq), sh.thd_stride(k.ldq), kQ,
                           false, false, oq);
  const Desc& kt = g.tensor("K^T", CUDNN_DATA_BFLOAT16, sh.bhds(sh.hkv), sh.thd_t_stride(k.ldk),
                            kK, false, false, ok);
  const Desc& v = g.tensor("V", CUDNN_DATA_BFLOAT16, sh.bhsd(sh.hkv), sh.thd_stride(k.ldv), kV,
                           false, false, ov);
  const Desc& o = g.tensor("O", CUDNN_DATA_BFLOAT16, sh.bhsd(sh.hq), sh.thd_stride(k.ldo), kO,
                           false, false, oo);
  const Desc& stats = g.tensor("Stats", CUDNN_DATA_FLOAT, sh.row(), sh.row_stride(), kStats);

  const Desc& s = masked_scores(g, sh, c, q, kt, true, nullptr);
  const Dims sd = sh.score(), ss = sh.score_stride(), rd = sh.row(), rs = sh.row_stride();
  const Desc& mx = g.virt("row_max", CUDNN_DATA_FLOAT, rd, rs);
  g.reduction("max", CUDNN_REDUCE_TENSOR_MAX, s, mx);
  const Desc& sub = g.virt("S_minus_max", CUDNN_DATA_FLOAT, sd, ss);
  g.pointwise("sub_max", CUDNN_POINTWISE_SUB, s, &mx, nullptr, sub);
  const Desc& e = g.virt("exp", CUDNN_DATA_FLOAT, sd, ss);
  g.pointwise("exp", CUDNN_POINTWISE_EXP, sub, nullptr, nullptr, e);
  const Desc& sum = g.virt("row_sum", CUDNN_DATA_FLOAT, rd, rs);
  g.reduction("sum", CUDNN_REDUCE_TENSOR_ADD, e, sum);
  const Desc& lg = g.virt("log_sum", CUDNN_DATA_FLOAT, rd, rs);
  g.pointwise("log", CUDNN_POINTWISE_LOG, sum, nullptr, nullptr, lg);
  g.pointwise("stats", CUDNN_POINTWISE_ADD, mx, &lg, nullptr, stats);
  const Desc& p = g.virt("P", CUDNN_DATA_BFLOAT16, sd, ss);
  g.pointwise("div_sum", CUDNN_POINTWISE_DIV, e, &sum, nullptr, p);
  g.matmul("bmm_p_v", p, v, o, c.seq_q, nullptr, c.seq_kv);
}

// dst = src summed over the query heads of each kv head (GQA), or src itself (MHA): returns
// the tensor a matmul writes.
const Desc& per_query_head(Graph& g, const Shapes& sh, const char* name, const Desc& final_t) {
  if (sh.hq == sh.hkv) return final_t;
  return g.virt(name, CUDNN_DATA_BFLOAT16, sh.bhsd(sh.hq), sh.bhsd_stride(sh.hq));
}

void build_backward(Graph& g) {
  const GraphKey& k = g.key();
  const Shapes sh{k.B, k.S, k.hq, k.hkv, k.d};
  const Common c = common_tensors(g, sh, k.dense);
  const Desc* oq = ragged_offset(g, "ragged_offset_q", sh, kOffQ, k.dense);
  const Desc* ok = ragged_offset(g, "ragged_offset_k", sh, kOffK, k.dense);
  const Desc* ov = ragged_offset(g, "ragged_offset_v", sh, kOffV, k.dense);
  const Desc* oo = ragged_offset(g, "ragged_offset_o", sh, kOffO, k.dense);
  const Desc* odo = ragged_offset(g, "ragged_offset_do", sh, kOffDO, k.dense);
  const Desc* odq = ragged_offset(g, "ragged_offset_dq", sh, kOffDQ, k.dense);
  const Desc* odk = ragged_offset(g, "ragged_offset_dk", sh, kOffDK, k.dense);
  const Desc* odv = ragged_offset(g, "ragged_offset_dv", sh, kOffDV, k.dense);
  const auto bf = CUDNN_DATA_BFLOAT16;
  const Desc& q = g.tensor("Q", bf, sh.bhsd(sh.hq), sh.thd_stride(k.ldq), kQ, false, false, oq);
  const Desc& kt =
      g.tensor("K^T", bf, sh.bhds(sh.hkv), sh.thd_t_stride(k.ldk), kK, false, false, ok);
  const Desc& vt =
      g.tensor("V^T", bf, sh.bhds(sh.hkv), sh.thd_t_stride(k.ldv), kV, false, false, ov);
  const Desc& o = g.tensor("O", bf, sh.bhsd(sh.hq), sh.thd_stride(k.ldo), kO, false, false, oo);
  const Desc& dout =
      g.tensor("dO", bf, sh.bhsd(sh.hq), sh.thd_stride(k.lddo), kDO, false, false, odo);
  const Desc& dq =
      g.tensor("dQ", bf, sh.bhsd(sh.hq), sh.thd_stride(k.lddq), kDQ, false, false, odq);
  const Desc& dk =
      g.tensor("dK", bf, sh.bhsd(sh.hkv), sh.thd_stride(k.lddk), kDK, false, false, odk);
  const Desc& dv =
      g.tensor("dV", bf, sh.bhsd(sh.hkv), sh.thd_stride(k.lddv), kDV, false, false, odv);
  const Desc& stats = g.tensor("Stats", CUDNN_DATA_FLOAT, sh.row(), sh.row_stride(), kStats);
  const Dims sd = sh.score(), ss = sh.score_stride(), rd = sh.row(), rs = sh.row_stride();

  // sum = rowsum(dO * O), a non-virtual f32 tensor in our workspace.
  const Desc& doo = g.virt("dO_O", CUDNN_DATA_FLOAT, sh.bhsd(sh.hq),
                           {sh.hq * sh.S * sh.d, sh.S * sh.d, sh.hq * sh.d, 1});
  g.pointwise("mul_dO_O", CUDNN_POINTWISE_MUL, dout, &o, nullptr, doo);
  const Desc& red = g.virt("rowsum_dO_O", CUDNN_DATA_FLOAT, rd, rs);
  g.reduction("reduce_dO_O", CUDNN_REDUCE_TENSOR_ADD, doo, red);
  const Desc& one = g.scalar("one", kOne);
  const Desc& sum = g.tensor("softmax_sum", CUDNN_DATA_FLOAT, rd, rs, kSoftmaxSum);
  g.pointwise("scale_sum", CUDNN_POINTWISE_MUL, red, &one, nullptr, sum);

  // P = exp(masked scores - Stats), dV = P^T dO.
  const Desc& sm = masked_scores(g, sh, c, q, kt, false, &stats);
  const Desc& e = g.virt("P", CUDNN_DATA_FLOAT, sd, ss);
  g.pointwise("exp", CUDNN_POINTWISE_EXP, sm, nullptr, nullptr, e);
  const Desc& pt = g.virt("P^T", bf, sd, sh.score_t_stride());
  g.reshape("reshape_p", e, pt);
  const Desc& dv_full = per_query_head(g, sh, "dV_per_q_head", dv);
  g.matmul("bmm_pt_dO", pt, dout, dv_full, c.seq_kv, nullptr, c.seq_q);
  if (&dv_full != &dv) g.reduction("reduce_dV_heads", CUDNN_REDUCE_TENSOR_ADD, dv_full, dv);

  // dS = (dO V^T - sum) * P * scale, dK = dS^T Q.
  const Desc& dp = g.virt("dP", CUDNN_DATA_FLOAT, sd, ss);
  g.matmul("bmm_dO_vt", dout, vt, dp, c.seq_q, c.seq_kv, nullptr);
  const Desc& x1 = g.virt("dP_minus_sum", CUDNN_DATA_FLOAT, sd, ss);
  g.pointwise("sub_sum", CUDNN_POINTWISE_SUB, dp, &sum, nullptr, x1);
  const Desc& x2 = g.virt("dP_times_P", CUDNN_DATA_FLOAT, sd, ss);
  g.pointwise("mul_p", CUDNN_POINTWISE_MUL, x1, &e, nullptr, x2);
  const Desc& ds = g.virt("dS", CUDNN_DATA_FLOAT, sd, ss);
  g.pointwise("mul_dS_scale", CUDNN_POINTWISE_MUL, x2, c.scale, nullptr, ds);
  const Desc& dst = g.virt("dS^T", bf, sd, sh.score_t_stride());
  g.reshape("reshape_dS", ds, dst);
  const Desc& dk_full = per_query_head(g, sh, "dK_per_q_head", dk);
  g.matmul("bmm_dSt_q", dst, q, dk_full, c.seq_kv, nullptr, c.seq_q);
  if (&dk_full != &dk) g.reduction("reduce_dK_heads", CUDNN_REDUCE_TENSOR_ADD, dk_full, dk);

  // dQ = dS K (K: the transpose of K^T, same rows and offsets), through the f32 accumulator
  // unless deterministic.
  const Desc& kk =
      g.virt("K", bf, sh.bhsd(sh.hkv), sh.thd_stride(k.ldk), ok);
  g.reshape("reshape_k", kt, kk);
  if (k.deterministic) {
    g.matmul("bmm_dS_k", ds, kk, dq, c.seq_q, nullptr, c.seq_kv);
    return;
  }
  const Desc& acc =
      g.tensor("dQ_accum", CUDNN_DATA_FLOAT, sh.bhsd(sh.hq), sh.bhsd_stride(sh.hq), kDQAccum);
  g.matmul("bmm_dS_k", ds, kk, acc, c.seq_q, nullptr, c.seq_kv);
  g.pointwise("identity_dQ", CUDNN_POINTWISE_IDENTITY, acc, nullptr, nullptr, dq);
}

// ---- plans -------------------------------------------------------------------------------------

struct Plan {
  std::unique_ptr<Graph> graph;  // the descriptors the op graph refers to
  std::unique_ptr<Desc> op_graph, engine_cfg, plan;
  int64_t workspace = 0;
  int64_t engine_index = -1;
  bool nondeterministic = false;
};

int64_t get_int64(const Desc& d, cudnnBackendAttributeName_t attr, const char* attr_name) {
  int64_t v = 0, n = 0;
  const cudnnStatus_t st =
      dnn().cudnnBackendGetAttribute(d.get(), attr, CUDNN_TYPE_INT64, 1, &n, &v);
  if (st != CUDNN_STATUS_SUCCESS) refuse(cat(d.name(), " get ", attr_name), st);
  return v;
}

// The engine configurations of one heuristics mode.
void heuristic_configs(const Desc& op_graph, cudnnBackendHeurMode_t mode, const char* mname,
                       std::vector<std::unique_ptr<Desc>>& out) {
  Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, cat("engine heuristics (mode ", mname, ")"));
  SF_SET_DESC(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, op_graph);
  SF_SET(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  heur.finalize();
  int64_t count = 0;
  cudnnStatus_t st = dnn().cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                              CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr);
  if (st != CUDNN_STATUS_SUCCESS) refuse(cat(heur.name(), " result count"), st);
  if (count <= 0) return;
  std::vector<std::unique_ptr<Desc>> cfgs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < count; ++i) {
    cfgs.push_back(std::make_unique<Desc>(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR,
                                          cat("engine config ", i, " (heuristics ", mname, ")")));
    raw.push_back(cfgs.back()->get());
  }
  int64_t got = 0;
  st = dnn().cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, raw.data());
  if (st != CUDNN_STATUS_SUCCESS) refuse(cat(heur.name(), " results"), st);
  for (int64_t i = 0; i < got && i < count; ++i) out.push_back(std::move(cfgs[size_t(i)]));
}

// The engine configurations cuDNN's heuristics offer, mode A's first, then the fallback list's;
// a Refusal naming both modes' failures when there is none.
std::vector<std::unique_ptr<Desc>> engine_configs(const Desc& op_graph) {
  std::vector<std::unique_ptr<Desc>> out;
  std::string why;
  for (auto [mode, mname] : {std::pair{CUDNN_HEUR_MODE_A, "A"},
                             std::pair{CUDNN_HEUR_MODE_FALLBACK, "fallback"}}) {
    const size_t before = out.size();
    try {
      heuristic_configs(op_graph, mode, mname, out);
      if (out.size() == before) {
        char last[1024] = {0};
        dnn().cudnnGetLastErrorString(last, sizeof(last));
        why += cat(why.empty() ? "" : "; ", "mode ", mname, ": none", last[0] ? " (" : "", last,
                   last[0] ? ")" : "");
      }
    } catch (const Refusal& r) {
      why += cat(why.empty() ? "" : "; ", r.what());
    }
  }
  if (out.empty()) throw Refusal(cat("cuDNN's heuristics offer no engine (", why, ")"));
  return out;
}

// Global index and the non-determinism note of a configuration's engine (for the plan info).
void describe_engine(const Desc& cfg, Plan& p) {
  Desc eng(CUDNN_BACKEND_ENGINE_DESCRIPTOR, "engine of " + cfg.name());
  cudnnBackendDescriptor_t e = eng.get();
  int64_t n = 0;
  cudnnStatus_t st = dnn().cudnnBackendGetAttribute(cfg.get(), CUDNN_ATTR_ENGINECFG_ENGINE,
                                              CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &e);
  if (st != CUDNN_STATUS_SUCCESS) refuse(cat(cfg.name(), " get CUDNN_ATTR_ENGINECFG_ENGINE"), st);
  p.engine_index = get_int64(eng, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, "CUDNN_ATTR_ENGINE_GLOBAL_INDEX");
  cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
  st = dnn().cudnnBackendGetAttribute(eng.get(), CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
                                CUDNN_TYPE_NUMERICAL_NOTE, CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n,
                                notes);
  if (st != CUDNN_STATUS_SUCCESS) refuse(cat(eng.name(), " get CUDNN_ATTR_ENGINE_NUMERICAL_NOTE"), st);
  for (int64_t i = 0; i < n; ++i)
    if (notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) p.nondeterministic = true;
}

// A plan asking for more than this is refused (a deterministic backward may want a [B, Hq, S, S]
// scratch, hopeless for long sequences): the native kernels run the call instead. The atomic
// backward's grows with T * Hq * D (2 GiB + 768 B for one 128K sequence of 32 x 128 heads on the
// H200): it may take twice as much, which the planner counts (attention_workspace_bytes), and an
// allocation the budget cannot give still falls back to the native kernels.
constexpr int64_t kMaxPlanWorkspace = int64_t(2) << 30;
int64_t max_plan_workspace(bool deterministic) { return deterministic ? kMaxPlanWorkspace : 2 * kMaxPlanWorkspace; }

// Builds the graph and the first execution plan that finalizes; throws Refusal naming the
// failing step (every configuration's failure when none finalizes).
std::unique_ptr<Plan> build_plan(const GraphKey& key, cudnnHandle_t handle) {
  auto p = std::make_unique<Plan>();
  p->graph = std::make_unique<Graph>(key);
  if (key.backward) build_backward(*p->graph);
  else build_forward(*p->graph);
  p->op_graph = std::make_unique<Desc>(p->graph->finish(handle));
  auto cfgs = engine_configs(*p->op_graph);
  std::string tried;
  for (auto& cfg : cfgs) {
    try {
      auto plan = std::make_unique<Desc>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR,
                                         "execution plan of " + cfg->name());
      SF_SET(*plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
      SF_SET_DESC(*plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, *cfg);
      plan->finalize();
      p->workspace = get_int64(*plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                               "CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE");
      if (p->workspace > max_plan_workspace(key.deterministic))
        throw Refusal(cat(cfg->name(), " wants ", p->workspace, " bytes of workspace (limit ",
                          max_plan_workspace(key.deterministic), ")"));
      p->nondeterministic = false;
      if (key.deterministic) {
        describe_engine(*cfg, *p);  // must know: a Refusal here skips the configuration
        if (p->nondeterministic)
          throw Refusal(cat(cfg->name(), " (engine ", p->engine_index, ") is non-deterministic"));
      } else {
        try {
          describe_engine(*cfg, *p);
        } catch (const Refusal&) {  // only the plan info lacks it
          p->engine_index = -1;
        }
      }
      p->plan = std::move(plan);
      p->engine_cfg = std::move(cfg);
      return p;
    } catch (const Refusal& r) {
      tried += cat(tried.empty() ? "" : "; ", r.what());
    }
  }
  throw Refusal(cat("no engine configuration finalizes: ", tried));
}

// ---- calls -------------------------------------------------------------------------------------

// The smallest of 1, 2, 3, 4, 6, 8, 12, 16, 24, ... (powers of two and 1.5x them) >= n: at most
// 1.5x padding and two plans per octave of lengths or sequence counts.
int64_t bucket(int64_t n) {
  for (int64_t p = 1;; p *= 2) {
    if (p >= n) return p;
    if (p >= 2 && p + p / 2 >= n) return p + p / 2;
  }
}

void check_view(const Mat& m, int64_t rows, int64_t cols, const char* arg) {
  SF_CHECK(m.dtype == DType::bf16, "cuda cudnn attention: ", arg, " must be bf16, got ",
           dtype_name(m.dtype));
  SF_CHECK(m.rows == rows && m.cols == cols && (m.rows <= 1 || m.ld >= m.cols),
           "cuda cudnn attention: ", arg, " is [", m.rows, ", ", m.cols, "] with row stride ",
           m.ld, ", expected [", rows, ", ", cols, "]");
  SF_CHECK(m.data != nullptr || m.numel() == 0, "cuda cudnn attention: ", arg, " has no data");
  SF_REQUIRE(m.rows <= 1 || m.ld % 8 == 0, "cuda cudnn attention: ", arg, " row stride ", m.ld,
             " must be a multiple of 8 elements (16-byte rows)");
  SF_REQUIRE(reinterpret_cast<uintptr_t>(m.data) % 16 == 0, "cuda cudnn attention: ", arg,
             " must be 16-byte aligned");
}

// The host's cu_seqlens, where given, must describe the call: 0 to its tokens, non-decreasing,
// the longest max_seqlen (a mismatch with the device's copy cannot be seen here).
void check_host_lengths(const AttentionShape& sh, int64_t tokens) {
  const int32_t* cu = sh.host_cu_seqlens;
  if (cu == nullptr) return;
  SF_CHECK(cu[0] == 0 && cu[sh.n_seqs] == tokens, "cuda cudnn attention: host_cu_seqlens runs ",
           cu[0], " .. ", cu[sh.n_seqs], ", expected 0 .. ", tokens, " (the call's tokens)");
  int64_t longest = 0;
  for (int i = 0; i < sh.n_seqs; ++i) {
    SF_CHECK(cu[i + 1] >= cu[i], "cuda cudnn attention: host_cu_seqlens decreases at ", i + 1);
    longest = std::max<int64_t>(longest, cu[i + 1] - cu[i]);
  }
  SF_CHECK(longest == sh.max_seqlen, "cuda cudnn attention: host_cu_seqlens' longest sequence is ",
           longest, ", max_seqlen says ", sh.max_seqlen);
}

// Checks the call as the native launchers do; false where there is nothing for cuDNN to do
// (no tokens), which the native launcher handles.
bool check_call(const CudnnAttentionCall& c) {
  const AttentionShape& sh = c.shape;
  SF_CHECK(sh.n_heads > 0 && sh.n_kv_heads > 0 && sh.n_heads % sh.n_kv_heads == 0,
           "cuda cudnn attention: n_heads ", sh.n_heads, " must be a positive multiple of "
           "n_kv_heads ", sh.n_kv_heads);
  SF_REQUIRE(sh.head_dim == 64 || sh.head_dim == 128, "cuda cudnn attention: head_dim ",
             sh.head_dim, " is not supported on the GPU (64 or 128)");
  SF_CHECK(sh.n_seqs >= 1 && sh.n_seqs < 65536 && c.cu_seqlens != nullptr,
           "cuda cudnn attention: need cu_seqlens for 1..65535 sequences, got n_seqs = ",
           sh.n_seqs);
  SF_CHECK(sh.max_seqlen >= 0, "cuda cudnn attention: max_seqlen ", sh.max_seqlen);
  const int64_t T = c.q.rows, qd = int64_t(sh.n_heads) * sh.head_dim,
                kvd = int64_t(sh.n_kv_heads) * sh.head_dim;
  check_view(c.q, T, qd, "q");
  check_view(c.k, T, kvd, "k");
  check_view(c.v, T, kvd, "v");
  check_view(c.out, T, qd, "out");
  SF_CHECK(c.lse != nullptr || T == 0, "cuda cudnn attention: lse is null");
  if (c.backward) {
    check_view(c.dq, T, qd, "dq");
    check_view(c.dk, T, kvd, "dk");
    check_view(c.dv, T, kvd, "dv");
    check_view(c.dout, T, qd, "dout");
  }
  check_host_lengths(sh, T);
  // (A bucket past 65535 sequences would overflow the helper kernels' grid: ours run it.)
  return T > 0 && sh.max_seqlen > 0 && bucket(sh.n_seqs) <= 65535;
}

// Whether every sequence of a call fills the length bucket S (tokens: the call's rows; -1 where
// unknown, a planner's question: then only one sequence can be known to).
bool every_sequence_fills(const AttentionShape& sh, int64_t S, int64_t tokens) {
  return sh.max_seqlen == S && (sh.n_seqs == 1 || tokens == int64_t(sh.n_seqs) * S);
}

// A dense graph's batch is the call's sequences exactly (no empty ones: nothing is masked), a
// packed graph's the bucket of their count.
GraphKey key_from(const AttentionShape& sh, const AttentionStrides& ld, bool backward,
                  int device, int64_t tokens) {
  GraphKey k;
  k.backward = backward;
  k.deterministic = backward && attention_deterministic();
  k.device = device;
  k.S = int(bucket(std::max(sh.max_seqlen, 64)));
  k.dense = cudnn_dense_graphs() && every_sequence_fills(sh, k.S, tokens);
  k.B = k.dense ? sh.n_seqs : int(bucket(sh.n_seqs));
  k.hq = sh.n_heads;
  k.hkv = sh.n_kv_heads;
  k.d = sh.head_dim;
  k.ldq = ld.q;
  k.ldk = ld.k;
  k.ldv = ld.v;
  k.ldo = ld.out;
  if (backward) {
    k.lddo = ld.dout;
    k.lddq = ld.dq;
    k.lddk = ld.dk;
    k.lddv = ld.dv;
  }
  return k;
}

// A packed graph pads every sequence to S rows in its statistics, its softmax sums, the f32 dQ
// accumulator and cuDNN's per-query-head partials of dK and dV (its own workspace): B x S rows
// of each, which for a few long and many short sequences is many times the call's tokens (11
// sequences of up to 32K in 64K tokens: 12 x 32K, 6 GiB of partials, past the plan limit). So a
// call runs in parts of consecutive sequences whose padded rows fit in its tokens, the size the
// planner counts (engine/plan_memory.cpp, attention_workspace_bytes); sequences are
// independent, so the parts give each sequence what one call gives it.
struct Part {
  int first_seq = 0, n_seqs = 0;
  int64_t row0 = 0;  // its first token (a dense graph's tensors start there; packed: unused)
  GraphKey key;
};

// A sequence that fills its length bucket and is this long runs alone on the dense graph rather
// than packed with its neighbours. Measured on the H200 (docs/BENCHMARKS.md, varlen rows): a 32K
// sequence alone took the 64K mix 3-4% faster at D 64 and 128; an 8K one alone moved the 32K
// mix by -3% (D 128) / +2% (D 64), inside that row's spread: no gain shown at 8K.
constexpr int kDenseAloneTokens = 16384;

bool fills_bucket(int64_t len) { return len >= 64 && bucket(len) == len; }

// The largest bucket <= n (n >= 1).
int64_t bucket_at_most(int64_t n) {
  int64_t b = 1;
  while (bucket(b + 1) <= n) b = bucket(b + 1);
  return b;
}

// A packed part's B (PackedBatch): the bucket of its count, or as many rows as the call's
// tokens allow.
int packed_batch(int64_t n_seqs, int64_t S, int64_t tokens) {
  const int64_t by_count = bucket(n_seqs);
  if (cudnn_packed_batch() == PackedBatch::by_count) return int(by_count);
  return int(std::clamp<int64_t>(bucket_at_most(std::max<int64_t>(1, tokens / S)), by_count,
                                 65535));
}

// Without the host's lengths: k sequences a part, k the largest bucket with k x S <= tokens
// (S the bucket of the longest). A dense call has no padding: one part.
std::vector<Part> uniform_parts(const GraphKey& whole, const AttentionShape& sh,
                                int64_t tokens) {
  const int64_t k = bucket_at_most(std::max<int64_t>(1, tokens / whole.S));
  if (whole.dense) return {Part{0, sh.n_seqs, 0, whole}};
  std::vector<Part> parts;
  for (int first = 0; first < sh.n_seqs; first += int(k)) {
    Part p{first, int(std::min<int64_t>(k, sh.n_seqs - first)), 0, whole};
    p.key.B = packed_batch(p.n_seqs, whole.S, tokens);
    parts.push_back(p);
  }
  return parts;
}

// With them: greedy runs of consecutive sequences, each padded to the bucket of its own longest
// (k x S <= tokens as above; one sequence always fits), a long bucket-filling sequence (and
// equal ones after it) on the dense graph.
std::vector<Part> length_parts(const AttentionShape& sh, const AttentionStrides& ld,
                               bool backward, int device, int64_t tokens) {
  const int32_t* cu = sh.host_cu_seqlens;
  auto len = [&](int i) { return int64_t(cu[i + 1]) - cu[i]; };
  auto alone = [&](int i) {
    return cudnn_dense_graphs() && len(i) >= kDenseAloneTokens && fills_bucket(len(i));
  };
  std::vector<Part> parts;
  for (int i = 0; i < sh.n_seqs;) {
    int n = 1;
    int64_t longest = len(i);
    if (alone(i)) {
      while (i + n < sh.n_seqs && len(i + n) == longest && (n + 1) * longest <= tokens) ++n;
    } else {
      for (; i + n < sh.n_seqs && !alone(i + n); ++n) {
        const int64_t l = std::max(longest, len(i + n));
        if (bucket(n + 1) * bucket(std::max<int64_t>(l, 64)) > tokens) break;
        longest = l;
      }
    }
    AttentionShape part = sh;
    part.n_seqs = n;
    part.max_seqlen = int(longest);
    Part p{i, n, cu[i], key_from(part, ld, backward, device, cu[i + n] - cu[i])};
    if (!p.key.dense) p.key.B = packed_batch(n, p.key.S, tokens);
    parts.push_back(p);
    i += n;
  }
  return parts;
}

std::vector<Part> parts_of(const AttentionShape& sh, const AttentionStrides& ld, bool backward,
                           int device, int64_t tokens) {
  if (sh.host_cu_seqlens != nullptr) return length_parts(sh, ld, backward, device, tokens);
  return uniform_parts(key_from(sh, ld, backward, device, tokens), sh, tokens);
}

AttentionStrides strides_of(const CudnnAttentionCall& c) {
  AttentionStrides ld{c.q.ld, c.k.ld, c.v.ld, c.out.ld};
  if (c.backward) {
    ld.dout = c.dout.ld;
    ld.dq = c.dq.ld;
    ld.dk = c.dk.ld;
    ld.dv = c.dv.ld;
  }
  return ld;
}

std::vector<Part> parts_of(const CudnnAttentionCall& c, int device) {
  return parts_of(c.shape, strides_of(c), c.backward, device, c.q.rows);
}

std::string key_text(const GraphKey& k) {
  return cat(k.backward ? (k.deterministic ? "deterministic backward" : "backward") : "forward",
             k.dense ? " dense" : "", " B=", k.B, " S=", k.S, " Hq=", k.hq,
             " Hkv=", k.hkv, " D=", k.d, " ld q/k/v/out=", k.ldq, "/", k.ldk, "/", k.ldv, "/",
             k.ldo, k.backward ? cat(" dout/dq/dk/dv=", k.lddo, "/", k.lddq, "/", k.lddk, "/",
                                     k.lddv)
                               : std::string());
}

int n_ragged(const GraphKey& k) { return k.backward ? 8 : 4; }

// Byte offsets of the workspace's parts (each 256-byte aligned).
struct Layout {
  size_t seq_len = 0, offsets = 0, stats = 0, sum = 0, accum = 0, plan = 0, total = 0;
};

Layout layout_of(const GraphKey& k, int64_t plan_ws) {
  Layout l;
  size_t at = 0;
  auto take = [&](size_t bytes) {
    const size_t here = at;
    at = (at + bytes + 255) / 256 * 256;
    return here;
  };
  const size_t rows = size_t(k.B) * size_t(k.hq) * size_t(k.S);
  l.seq_len = take(size_t(k.B) * sizeof(int32_t));
  l.offsets = take(size_t(n_ragged(k)) * size_t(k.B + 1) * sizeof(int64_t));
  l.stats = take(rows * sizeof(float));
  if (k.backward) {
    l.sum = take(rows * sizeof(float));
    if (!k.deterministic) l.accum = take(rows * size_t(k.d) * sizeof(float));
  }
  l.plan = take(size_t(plan_ws));
  l.total = at;
  return l;
}

// Process-wide state: one handle per device, the plan cache, refusals (each printed once).
struct State {
  std::mutex mu;
  std::map<int, cudnnHandle_t> handles;
  std::map<GraphKey, std::unique_ptr<Plan>> plans;
  std::map<GraphKey, std::string> refused;
  CudnnAttentionStats stats;
};
State& state() {
  static State* s = new State;  // never destroyed: plans must not outlive CUDA teardown order
  return *s;
}

cudnnHandle_t handle_for(State& st, int device) {
  auto it = st.handles.find(device);
  if (it != st.handles.end()) return it->second;
  cudnnHandle_t h = nullptr;
  const cudnnStatus_t s = dnn().cudnnCreate(&h);
  if (s != CUDNN_STATUS_SUCCESS) refuse("cudnnCreate", s);
  st.handles[device] = h;
  return h;
}

// The cached plan of a key, built on first use; nullptr where cuDNN refuses it. Caller holds mu.
Plan* plan_for(State& st, const GraphKey& key) {
  auto it = st.plans.find(key);
  if (it != st.plans.end()) return it->second.get();
  if (st.refused.count(key) != 0) return nullptr;
  const auto t0 = std::chrono::steady_clock::now();
  auto took = [&] {
    st.stats.plan_build_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  try {
    auto p = build_plan(key, handle_for(st, key.device));
    took();
    ++st.stats.plans_built;
    return (st.plans[key] = std::move(p)).get();
  } catch (const Refusal& r) {
    took();
    ++st.stats.plans_refused;
    st.refused[key] = r.what();
    std::fprintf(stderr, "sf: cuDNN attention refused %s: %s; the native kernels run such calls\n",
                 key_text(key).c_str(), r.what());
    return nullptr;
  }
}

void execute(State& st, const GraphKey& key, const Plan& p, cudaStream_t s, void* ws,
             const std::vector<int64_t>& uids, const std::vector<void*>& ptrs) {
  cudnnHandle_t h = handle_for(st, key.device);
  std::unique_ptr<Desc> vpp;
  void* plan_ws = ws;
  try {
    vpp = std::make_unique<Desc>(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, "variant pack");
    Desc& vp = *vpp;
    SF_SET(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, int64_t(uids.size()),
           uids.data());
    SF_SET(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, int64_t(ptrs.size()),
           ptrs.data());
    SF_SET(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &plan_ws);
    vp.finalize();
  } catch (const Refusal& r) {
    SF_FAIL(cuda, "cuDNN attention (", key_text(key), "): ", r.what());
  }
  cudnnStatus_t rc = dnn().cudnnSetStream(h, s);
  if (rc != CUDNN_STATUS_SUCCESS)
    SF_FAIL(cuda, "cuDNN attention: cudnnSetStream: ", status_text(rc));
  rc = dnn().cudnnBackendExecute(h, p.plan->get(), vpp->get());
  if (rc != CUDNN_STATUS_SUCCESS)
    SF_FAIL(cuda, "cuDNN attention (", key_text(key), ", engine ", p.engine_index,
            "): cudnnBackendExecute: ", status_text(rc));
  ++st.stats.executions;
  if (key.dense) ++st.stats.dense_executions;
}

void* at(void* ws, size_t off) { return static_cast<char*>(ws) + off; }

int current_device() {
  int d = 0;
  CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

// The plans of a call's parts, or empty where cuDNN refuses any (then none of it runs on
// cuDNN). Caller holds mu.
std::vector<const Plan*> plans_for(State& st, const std::vector<Part>& parts) {
  std::vector<const Plan*> plans;
  for (const Part& p : parts) {
    const Plan* plan = plan_for(st, p.key);
    if (plan == nullptr) return {};
    plans.push_back(plan);
  }
  return plans;
}

// The workspace of a call in parts (they run one after another): the largest part's; 0 where
// cuDNN refuses a part.
size_t parts_workspace(State& st, const std::vector<Part>& parts) {
  const std::vector<const Plan*> plans = plans_for(st, parts);
  size_t bytes = 0;
  for (size_t i = 0; i < plans.size(); ++i)
    bytes = std::max(bytes, layout_of(parts[i].key, plans[i]->workspace).total);
  return bytes;
}

}  // namespace

size_t cudnn_attention_workspace_bytes(const CudnnAttentionCall& call) {
  if (!check_call(call) || !cudnn_attention_available()) return 0;
  const std::vector<Part> parts = parts_of(call, current_device());
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  return parts_workspace(st, parts);
}

size_t cudnn_attention_workspace_bytes(const AttentionShape& sh, const AttentionStrides& ld,
                                       bool backward) {
  if (!cudnn_attention_available()) return 0;
  SF_REQUIRE(sh.n_heads > 0 && sh.n_kv_heads > 0 && sh.n_heads % sh.n_kv_heads == 0 &&
                 (sh.head_dim == 64 || sh.head_dim == 128) && sh.n_seqs >= 1,
             "cuda cudnn attention workspace: heads ", sh.n_heads, "/", sh.n_kv_heads,
             ", head_dim ", sh.head_dim, ", ", sh.n_seqs, " sequences: not an attention shape");
  if (sh.max_seqlen <= 0 || bucket(sh.n_seqs) > 65535) return 0;
  if (sh.host_cu_seqlens != nullptr) check_host_lengths(sh, sh.host_cu_seqlens[sh.n_seqs]);
  // Without lengths the tokens are unknown: sequences may fill no bucket (key tokens -1) and
  // take up to n_seqs x max_seqlen rows.
  const int device = current_device();
  const std::vector<Part> parts =
      sh.host_cu_seqlens != nullptr
          ? length_parts(sh, ld, backward, device, sh.host_cu_seqlens[sh.n_seqs])
          : uniform_parts(key_from(sh, ld, backward, device, -1), sh,
                          int64_t(sh.n_seqs) * sh.max_seqlen);
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  return parts_workspace(st, parts);
}

namespace {

// c restricted to one part's sequences. A dense graph addresses sequence b at row b x S of its
// tensors: they start at the part's first row (16-byte aligned: row strides are multiples of 8).
CudnnAttentionCall part_call(const CudnnAttentionCall& c, const Part& part) {
  CudnnAttentionCall pc = c;
  pc.cu_seqlens = c.cu_seqlens + part.first_seq;
  pc.shape.n_seqs = part.n_seqs;
  if (!part.key.dense || part.row0 == 0) return pc;
  for (Mat* m : {&pc.q, &pc.k, &pc.v, &pc.out, &pc.dq, &pc.dk, &pc.dv, &pc.dout})
    if (m->data != nullptr)
      m->data = static_cast<char*>(m->data) + size_t(part.row0 * m->ld) * m->elem_size();
  return pc;
}

// One part of a call (parts_of): c restricted to the part's sequences (cu_seqlens and n_seqs;
// lse and a packed graph's ragged offsets stay the whole call's, rows counted from its start; a
// dense graph's tensors start at the part's first row). Caller holds mu.
void run_part(State& st, cudaStream_t s, const CudnnAttentionCall& whole, const Part& part,
              const Plan* p, void* ws) {
  const CudnnAttentionCall c = part_call(whole, part);
  const GraphKey& key = part.key;
  const Layout l = layout_of(key, p->workspace);
  const AttentionShape& sh = c.shape;
  const int64_t T = c.q.rows;
  const std::vector<int64_t> lds = c.backward
      ? std::vector<int64_t>{key.ldq, key.ldk, key.ldv, key.ldo, key.lddo, key.lddq, key.lddk,
                             key.lddv}
      : std::vector<int64_t>{key.ldq, key.ldk, key.ldv, key.ldo};
  auto* seq_len = static_cast<int32_t*>(at(ws, l.seq_len));
  auto* offsets = static_cast<int64_t*>(at(ws, l.offsets));
  auto* stats = static_cast<float*>(at(ws, l.stats));
  auto off = [&](int j) -> void* { return offsets + int64_t(j) * (key.B + 1); };
  float scale = sh.scale, neg_inf = -INFINITY, one = 1.f;
  std::vector<int64_t> uids{kQ, kK, kV, kO, kStats, kScale, kNegInfCausal};
  std::vector<void*> ptrs{c.q.data, c.k.data, c.v.data, c.out.data, stats, &scale, &neg_inf};
  if (!key.dense) {  // the packed graph's lengths, offsets and padding mask
    launch_cudnn_attention_meta(s, c.cu_seqlens, sh.n_seqs, key.B, seq_len, offsets, lds.data(),
                                int(lds.size()));
    const int64_t packed_uids[] = {kSeqQ, kSeqKv, kNegInfPad, kOffQ, kOffK, kOffV, kOffO};
    void* packed_ptrs[] = {seq_len, seq_len, &neg_inf, off(0), off(1), off(2), off(3)};
    uids.insert(uids.end(), std::begin(packed_uids), std::end(packed_uids));
    ptrs.insert(ptrs.end(), std::begin(packed_ptrs), std::end(packed_ptrs));
  }
  if (c.backward) {
    launch_cudnn_lse_to_stats(s, stats, c.lse, c.cu_seqlens, sh.n_seqs, key.B, sh.n_heads,
                              key.S, T);
    const int64_t more_uids[] = {kDO, kDQ, kDK, kDV, kSoftmaxSum, kOne};
    void* more_ptrs[] = {c.dout.data, c.dq.data, c.dk.data, c.dv.data, at(ws, l.sum), &one};
    uids.insert(uids.end(), std::begin(more_uids), std::end(more_uids));
    ptrs.insert(ptrs.end(), std::begin(more_ptrs), std::end(more_ptrs));
    if (!key.dense) {
      const int64_t packed_uids[] = {kOffDO, kOffDQ, kOffDK, kOffDV};
      void* packed_ptrs[] = {off(4), off(5), off(6), off(7)};
      uids.insert(uids.end(), std::begin(packed_uids), std::end(packed_uids));
      ptrs.insert(ptrs.end(), std::begin(packed_ptrs), std::end(packed_ptrs));
    }
    if (!key.deterministic) {
      uids.push_back(kDQAccum);
      ptrs.push_back(at(ws, l.accum));
    }
  }
  execute(st, key, *p, s, at(ws, l.plan), uids, ptrs);
  if (!c.backward)
    launch_cudnn_stats_to_lse(s, c.lse, stats, c.cu_seqlens, sh.n_seqs, sh.n_heads, key.S, T);
}

}  // namespace

bool cudnn_attention_run(cudaStream_t s, const CudnnAttentionCall& c, void* ws, size_t ws_bytes) {
  NVTX_RANGE(c.backward ? "attention_backward_cudnn" : "attention_forward_cudnn");
  if (!check_call(c) || !cudnn_attention_available()) return false;
  const std::vector<Part> parts = parts_of(c, current_device());
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  const std::vector<const Plan*> plans = plans_for(st, parts);
  if (plans.empty()) return false;
  const size_t need = parts_workspace(st, parts);
  SF_REQUIRE(ws != nullptr && ws_bytes >= need && reinterpret_cast<uintptr_t>(ws) % 256 == 0,
             "cuda cudnn attention: the workspace holds ", ws_bytes, " bytes, the call needs ",
             need, " (256-byte aligned; size it with cudnn_attention_workspace_bytes)");
  for (size_t i = 0; i < parts.size(); ++i) run_part(st, s, c, parts[i], plans[i], ws);
  return true;
}

bool cudnn_attention_built() { return true; }

std::string cudnn_attention_graph_check(const CudnnAttentionCall& call) {
  if (cudnn_api() == nullptr) return cat("cuDNN is not loaded: ", cudnn_library_info().why);
  if (!check_call(call)) return "no tokens: no graph";
  try {
    for (const Part& part : parts_of(call, -1)) {
      Graph g(part.key);
      if (call.backward) build_backward(g);
      else build_forward(g);
      g.finish(nullptr);
    }
    return "";
  } catch (const Refusal& r) {
    return r.what();
  }
}

CudnnAttentionStats cudnn_attention_stats() {
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  return st.stats;
}

std::string cudnn_attention_plan_info(const CudnnAttentionCall& call) {
  if (!cudnn_attention_available())
    return cat("cuDNN attention unavailable: ", cudnn_attention_unavailable_reason());
  if (!check_call(call)) return "no tokens: nothing for cuDNN to run";
  const std::vector<Part> parts = parts_of(call, current_device());
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  const std::vector<const Plan*> plans = plans_for(st, parts);
  if (plans.empty()) {
    for (const Part& part : parts)
      if (st.refused.count(part.key) != 0)
        return cat("refused ", key_text(part.key), ": ", st.refused[part.key]);
    return "refused: no plan";
  }
  std::string in_parts;
  for (size_t i = 0; parts.size() > 1 && i < parts.size(); ++i)
    in_parts += cat(i == 0 ? cat(" (in ", parts.size(), " parts: ") : std::string(", "),
                    parts[i].n_seqs, " seqs", parts[i].key.dense ? " dense" : "", " B=",
                    parts[i].key.B, " S=", parts[i].key.S, i + 1 == parts.size() ? ")" : "");
  const Plan* p = plans[0];
  return cat(cudnn_version_text(cudnn_library_info()), " ", key_text(parts[0].key), in_parts,
             ": engine ", p->engine_index,
             p->nondeterministic ? " (non-deterministic)" : " (deterministic)",
             ", plan workspace ", p->workspace, " B, call workspace ",
             parts_workspace(st, parts), " B");
}

#endif  // SF_WITH_CUDNN

}  // namespace sf::cuda
