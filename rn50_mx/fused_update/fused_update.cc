// The optimizer's update of a group of tensors in one pass over each: momentum SGD, with LARS's trust ratio on the
// tensors marked for it, on float32 weights or on bfloat16 weights with float32 masters. rn50_mx/fused_update/
// __init__.py pushes `fused_update_run` to MXNet's engine with the arrays' read and write dependencies; it computes
// what MXNet 1.9.1's own CPU kernels compute there today, bit for bit:
//   multi_sum_sq (src/operator/contrib/multi_sum_sq.cc, CalcSumSq): per tensor `sum += x[j] * x[j]` in float,
//     j in order, a bfloat16 gradient widened exactly first (amp_cast);
//   multi_lars (src/operator/contrib/multi_lars-inl.h, MultiLARSKernel): the trust-ratio learning rate;
//   preloaded_multi_sgd_mom_update / multi_sgd_mom_update (src/operator/contrib/preloaded_multi_sgd-inl.h:172,
//     src/operator/optimizer_op-inl.h:225): mom = momentum*mom - lr*wd*w - lr*rescale*g; w = w + mom;
//   amp_cast to bfloat16 (oneDNN's reorder, vcvtneps2bf16 where the CPU has it; its C++ form is
//     src/common/bfloat16.cpp:28-44 at MXNet 1.9.1's oneDNN 5818c40): nearest, ties to even; a NaN kept with its
//     quiet bit set; a subnormal input becomes a zero of its sign (mshadow's bf16_t, which astype runs, truncates).
// The library's floats are parsed as MXNet parses operator arguments (dmlc::stof for a float field, the stream
// operator for a Tuple<float>'s items, float(dmlc::stod) for _mul_scalar's scalar), and every expression keeps the
// kernels' order of operations: this file is compiled with -ffp-contract=off (libmxnet.so's kernels have no fused
// multiply-add) and without -ffast-math.
#include <dmlc/strtonum.h>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <new>
#include <sstream>
#include <string>
#include <vector>

#ifndef FUSED_UPDATE_SOURCE_SHA
#error "build with -DFUSED_UPDATE_SOURCE_SHA=\"<sha256 of this file>\" (the Makefile does)"
#endif

namespace {

enum Isa { kAuto = 0, kPortable = 1, kAvx512 = 2, kAvx512Bf16 = 3 };

#define TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))
#define TARGET_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

// Tensors whose sums of squares one thread takes at once, interleaved: each sum is a chain of dependent additions
// (its order is multi_sum_sq's), so one alone waits on the adder's latency; four tensors' chains fill it.
constexpr int kLanes = 4;
constexpr int64_t kBlock = 256;  // elements per lane between the lanes' bookkeeping

struct Plan {
  int n = 0;
  bool bf16 = false;  // bfloat16 weights with float32 masters; else float32 weights, their own masters
  int isa = kPortable;
  float eta = 0, eps = 0, rescale = 1;
  std::vector<float> lrs, wds, momenta;
  std::vector<unsigned char> lars;
  std::vector<int64_t> sizes;
  std::vector<void*> weights;
  std::vector<const void*> grads;
  std::vector<float*> moms, masters;
};

inline float widen(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline float widen(float f) { return f; }

// Without branches, so that the compiler vectorizes the portable loop.
inline uint16_t narrow(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const uint32_t top = u >> 16;
  const uint32_t nearest = (u + 0x7fffu + (top & 1u)) >> 16;  // ties to even
  const uint32_t tiny = (u & 0x7f800000u) == 0 ? top & 0x8000u : nearest;  // zero, subnormal: signed zero
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? top | 0x40u : tiny);  // NaN: made quiet
}

// The learning rate of a LARS tensor (MultiLARSKernel, in its order of operations).
inline float trust_lr(float lr, float wd, float w_sq, float g_sq, const Plan& p) {
  float w_norm = sqrtf(w_sq);
  bool valid = w_norm > 0. && g_sq > 0.;
  return valid ? lr * p.eta * w_norm / (sqrtf(g_sq) * p.rescale + wd * w_norm + p.eps) : lr;
}

// ---- the element-wise update, one tensor ----------------------------------------------------------------------

template <typename W>
inline void update_portable(const Plan& p, int t, float lr) {
  const int64_t n = p.sizes[t];
  const W* g = static_cast<const W*>(p.grads[t]);
  float* m = p.moms[t];
  float* master = p.masters[t];
  W* out = static_cast<W*>(p.weights[t]);
  const float momentum = p.momenta[t], lr_wd = lr * p.wds[t], lr_rescale = lr * p.rescale;
  for (int64_t i = 0; i < n; ++i) {
    float w = master[i];
    float mom = momentum * m[i] - lr_wd * w - lr_rescale * widen(g[i]);
    m[i] = mom;
    w = w + mom;
    if constexpr (sizeof(W) == 2) {
      master[i] = w;
      out[i] = narrow(w);
    } else {
      out[i] = w;
    }
  }
}

TARGET_AVX512 inline __m512 load_grad(const float* g, __mmask16 k) { return _mm512_maskz_loadu_ps(k, g); }
TARGET_AVX512 inline __m512 load_grad(const uint16_t* g, __mmask16 k) {
  __m512i wide = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, g));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

// `narrow` on sixteen floats with AVX-512F and BW only.
TARGET_AVX512 inline __m256i narrow16(__m512 w) {
  const __m512i u = _mm512_castps_si512(w);
  const __m512i top = _mm512_srli_epi32(u, 16);
  const __m512i bias = _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(top, _mm512_set1_epi32(1)));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(w, w, _CMP_UNORD_Q);
  r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(top, _mm512_set1_epi32(0x40)));
  const __mmask16 tiny = _mm512_testn_epi32_mask(u, _mm512_set1_epi32(0x7f800000));
  r = _mm512_mask_mov_epi32(r, tiny, _mm512_and_si512(top, _mm512_set1_epi32(0x8000)));
  return _mm512_cvtepi32_epi16(r);
}

TARGET_AVX512BF16 inline __m256i narrow16_native(__m512 w) { return (__m256i)_mm512_cvtneps_pbh(w); }

// Compiled with avx512_bf16 allowed for both roundings: only kNative's branch asks for its instruction (the
// compiler makes none from plain code: objdump finds vcvtneps2bf16 in update_avx512<uint16_t, true> alone), and
// fused_update_plan picks kNative only where the CPU has it.
template <typename W, bool kNative>
TARGET_AVX512BF16 inline void update_avx512(const Plan& p, int t, float lr) {
  const int64_t n = p.sizes[t];
  const W* g = static_cast<const W*>(p.grads[t]);
  float* m = p.moms[t];
  float* master = p.masters[t];
  W* out = static_cast<W*>(p.weights[t]);
  const __m512 momentum = _mm512_set1_ps(p.momenta[t]);
  const __m512 lr_wd = _mm512_set1_ps(lr * p.wds[t]);
  const __m512 lr_rescale = _mm512_set1_ps(lr * p.rescale);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = n - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - i)) - 1);
    __m512 w = _mm512_maskz_loadu_ps(k, master + i);
    __m512 mom = _mm512_mul_ps(momentum, _mm512_maskz_loadu_ps(k, m + i));
    mom = _mm512_sub_ps(mom, _mm512_mul_ps(lr_wd, w));
    mom = _mm512_sub_ps(mom, _mm512_mul_ps(lr_rescale, load_grad(g + i, k)));
    _mm512_mask_storeu_ps(m + i, k, mom);
    w = _mm512_add_ps(w, mom);
    if constexpr (sizeof(W) == 2) {
      _mm512_mask_storeu_ps(master + i, k, w);
      __m256i b;
      if constexpr (kNative) {
        b = narrow16_native(w);
      } else {
        b = narrow16(w);
      }
      _mm256_mask_storeu_epi16(out + i, k, b);
    } else {
      _mm512_mask_storeu_ps(out + i, k, w);
    }
  }
}

// ---- LARS: the sums of squares, in multi_sum_sq's order, kLanes tensors at a time ------------------------------

// Runs over `tensors` (LARS ones), calling done(t, w_sq, g_sq) as each tensor's two sums are complete.
template <typename W, typename Done>
inline void sums_of_squares(const Plan& p, const std::vector<int>& tensors, Done done) {
  static const float zero_w[kBlock] = {};
  static const W zero_g[kBlock] = {};
  const float* w[kLanes];
  const W* g[kLanes];
  int64_t left[kLanes];
  int tensor[kLanes];
  float w_sq[kLanes], g_sq[kLanes];
  size_t next = 0;
  auto fill = [&](int l) {
    while (next < tensors.size() && p.sizes[tensors[next]] == 0) done(tensors[next++], 0.f, 0.f);
    tensor[l] = next < tensors.size() ? tensors[next++] : -1;
    w[l] = tensor[l] < 0 ? zero_w : p.masters[tensor[l]];
    g[l] = tensor[l] < 0 ? zero_g : static_cast<const W*>(p.grads[tensor[l]]);
    left[l] = tensor[l] < 0 ? INT64_MAX : p.sizes[tensor[l]];
    w_sq[l] = g_sq[l] = 0.f;
  };
  for (int l = 0; l < kLanes; ++l) fill(l);
  for (;;) {
    int64_t step = kBlock;
    bool busy = false;
    for (int l = 0; l < kLanes; ++l) {
      if (tensor[l] >= 0) {
        busy = true;
        step = std::min(step, left[l]);
      }
    }
    if (!busy) return;
    for (int64_t j = 0; j < step; ++j) {
      for (int l = 0; l < kLanes; ++l) {  // unrolled: 2 x kLanes independent chains
        const float a = w[l][j], b = widen(g[l][j]);
        w_sq[l] += a * a;
        g_sq[l] += b * b;
      }
    }
    for (int l = 0; l < kLanes; ++l) {
      if (tensor[l] < 0) continue;
      w[l] += step;
      g[l] += step;
      left[l] -= step;
      if (left[l] == 0) {
        done(tensor[l], w_sq[l], g_sq[l]);
        fill(l);
      }
    }
  }
}

// ---- one thread's share ------------------------------------------------------------------------------------------

template <typename W, typename Update>
inline void run_share(const Plan& p, const std::vector<int>& share, Update update) {
  std::vector<int> lars;
  for (int t : share) {
    if (p.lars[t]) {
      lars.push_back(t);
    } else {
      update(t, p.lrs[t]);
    }
  }
  sums_of_squares<W>(p, lars, [&](int t, float w_sq, float g_sq) {
    update(t, trust_lr(p.lrs[t], p.wds[t], w_sq, g_sq, p));  // right after its sums: its tail is still in cache
  });
}

template <typename W>
void share_portable(const Plan& p, const std::vector<int>& share) {
  run_share<W>(p, share, [&](int t, float lr) { update_portable<W>(p, t, lr); });
}

template <typename W>
TARGET_AVX512 void share_avx512(const Plan& p, const std::vector<int>& share) {
  run_share<W>(p, share, [&](int t, float lr) { update_avx512<W, false>(p, t, lr); });
}

template <typename W>
TARGET_AVX512BF16 void share_avx512bf16(const Plan& p, const std::vector<int>& share) {
  run_share<W>(p, share, [&](int t, float lr) { update_avx512<W, true>(p, t, lr); });
}

// The tensors split between `threads`, largest first onto the least loaded (their sizes are the work).
std::vector<std::vector<int>> shares(const Plan& p, int threads) {
  std::vector<int> order(p.n);
  for (int t = 0; t < p.n; ++t) order[t] = t;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p.sizes[a] > p.sizes[b]; });
  std::vector<std::vector<int>> out(threads);
  std::vector<int64_t> load(threads, 0);
  for (int t : order) {
    int least = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    out[least].push_back(t);
    load[least] += p.sizes[t];
  }
  return out;
}

int best_isa() {
  __builtin_cpu_init();
  bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl");
  if (avx512 && __builtin_cpu_supports("avx512bf16")) return kAvx512Bf16;
  return avx512 ? kAvx512 : kPortable;
}

template <typename W>
void run_plan(const Plan& p) {
  void (*share)(const Plan&, const std::vector<int>&) =
      p.isa == kAvx512Bf16 ? share_avx512bf16<W> : p.isa == kAvx512 ? share_avx512<W> : share_portable<W>;
  const int threads = std::max(1, std::min(omp_get_max_threads(), p.n));
  const std::vector<std::vector<int>> split = shares(p, threads);
#pragma omp parallel num_threads(threads)
  share(p, split[omp_get_thread_num()]);
}

}  // namespace

extern "C" {

// The sha256 of the source this library was built from (rn50_mx.fused_update refuses a stale build).
const char* fused_update_source_sha() { return FUSED_UPDATE_SOURCE_SHA; }

// The widest instruction set `fused_update_plan` can use here: 1 portable, 2 AVX-512, 3 AVX-512 with avx512_bf16.
int fused_update_best_isa() { return best_isa(); }

// A float operator argument as MXNet reads it (dmlc::stof, dmlc-core's parser in the wheel's headers); NaN if
// `text` is no number.
float fused_update_param_float(const char* text) {
  try {
    return dmlc::stof(text);
  } catch (...) {
    return NAN;
  }
}

// A double operator argument as MXNet reads it (dmlc::stod): the scalar of _mul_scalar, which multiplies a float32
// array by float(scalar); NaN if `text` is no number.
double fused_update_param_double(const char* text) {
  try {
    return dmlc::stod(text);
  } catch (...) {
    return NAN;
  }
}

// An item of a Tuple<float> operator argument as MXNet reads it (mxnet/tuple.h: `is >> value`); NaN if none.
float fused_update_tuple_float(const char* text) {
  std::istringstream is(text);
  float value;
  return (is >> value) ? value : NAN;
}

// The update of `n` tensors, made ready to run: every array copied, so the caller's may go. isa 0 takes the best the
// CPU has. Null if `isa` is beyond it or memory is short.
void* fused_update_plan(int n, int bf16, int isa, const int64_t* sizes, void* const* weights,
                        const void* const* grads, float* const* moms, float* const* masters,
                        const unsigned char* lars, const float* lrs, const float* wds, const float* momenta,
                        float eta, float eps, float rescale) {
  const int best = best_isa();
  if (isa == kAuto) isa = best;
  if (isa < kPortable || isa > best || n < 0) return nullptr;
  Plan* p = new (std::nothrow) Plan;
  if (!p) return nullptr;
  try {
    p->n = n;
    p->bf16 = bf16 != 0;
    p->isa = isa;
    p->eta = eta;
    p->eps = eps;
    p->rescale = rescale;
    p->sizes.assign(sizes, sizes + n);
    p->weights.assign(weights, weights + n);
    p->grads.assign(grads, grads + n);
    p->moms.assign(moms, moms + n);
    p->masters.assign(masters, masters + n);
    p->lars.assign(lars, lars + n);
    p->lrs.assign(lrs, lrs + n);
    p->wds.assign(wds, wds + n);
    p->momenta.assign(momenta, momenta + n);
  } catch (...) {
    delete p;
    return nullptr;
  }
  return p;
}

// Runs a plan: MXNet's EngineSyncFunc (the run context is unused), or called directly.
void fused_update_run(void* /*run_context*/, void* plan) {
  const Plan& p = *static_cast<const Plan*>(plan);
  if (p.bf16) {
    run_plan<uint16_t>(p);
  } else {
    run_plan<float>(p);
  }
}

// Frees a plan: MXNet's EngineFuncParamDeleter, once the engine has run it.
void fused_update_free(void* plan) { delete static_cast<Plan*>(plan); }

}  // extern "C"
