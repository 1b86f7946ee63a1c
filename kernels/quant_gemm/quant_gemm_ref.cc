// CPU reference of the quantized linear layer: GemmRef's blocking (kernels/gemm/gemm_ref.cc)
// with the weight tile dequantized to fp32 as it is loaded. Column blocks of kNBlock weight rows
// are ParallelFor tasks; each weight element is dequantized once whatever m is.
#include <algorithm>
#include <cmath>
#include <vector>

#include "base/check.h"
#include "base/thread_pool.h"
#include "kernels/common/host_elem.h"
#include "kernels/quant_gemm/fp8_e4m3.h"
#include "kernels/quant_gemm/quant_gemm.h"

namespace tandem {
namespace {

constexpr int64_t kNBlock = 32;
constexpr int64_t kKBlock = 256;
constexpr uint8_t kSymmetricInt4Zero = 8;

// tile[kk * kNBlock + j] = dequant(w)[n0 + j, k0 + kk], from whole dequantized rows.
void LoadTile(const std::vector<float>& rows, int64_t k, int64_t nb, int64_t k0, int64_t kb,
              float* tile) {
  for (int64_t j = 0; j < kNBlock; ++j) {
    for (int64_t kk = 0; kk < kb; ++kk) {
      tile[kk * kNBlock + j] = j < nb ? rows[j * k + k0 + kk] : 0.0f;
    }
  }
}

void ColumnBlock(const QuantGemmArgs& args, const float* a32, int64_t n0) {
  const int64_t nb = std::min(kNBlock, args.n - n0);
  std::vector<float> rows(nb * args.k);
  for (int64_t j = 0; j < nb; ++j) QuantDequantizeRow(args, n0 + j, rows.data() + j * args.k);
  std::vector<float> tile(kKBlock * kNBlock);
  std::vector<float> acc(args.m * kNBlock, 0.0f);
  for (int64_t k0 = 0; k0 < args.k; k0 += kKBlock) {
    const int64_t kb = std::min(kKBlock, args.k - k0);
    LoadTile(rows, args.k, nb, k0, kb, tile.data());
    for (int64_t i = 0; i < args.m; ++i) {
      const float* a_row = a32 + i * args.k + k0;
      float local[kNBlock];
      for (int64_t j = 0; j < kNBlock; ++j) local[j] = acc[i * kNBlock + j];
      for (int64_t kk = 0; kk < kb; ++kk) {
        const float av = a_row[kk];
        const float* t = tile.data() + kk * kNBlock;
        for (int64_t j = 0; j < kNBlock; ++j) local[j] += av * t[j];
      }
      for (int64_t j = 0; j < kNBlock; ++j) acc[i * kNBlock + j] = local[j];
    }
  }
  for (int64_t i = 0; i < args.m; ++i) {
    for (int64_t j = 0; j < nb; ++j) {
      float v = acc[i * kNBlock + j];
      if (args.bias != nullptr) v += LoadElem(args.bias, args.c_dtype, n0 + j);
      if (args.accumulate) v += LoadElem(args.c, args.c_dtype, i * args.n + n0 + j);
      StoreElem(args.c, args.c_dtype, i * args.n + n0 + j, v);
    }
  }
}

void QuantizeGroup(float* x, int64_t len) {
  float amax = 0.0f;
  for (int64_t i = 0; i < len; ++i) amax = std::max(amax, std::fabs(x[i]));
  if (amax == 0.0f) return;
  const float scale = amax / kFp8E4M3Max;
  for (int64_t i = 0; i < len; ++i) x[i] = Fp8E4M3ToF32(F32ToFp8E4M3(x[i] / scale)) * scale;
}

}  // namespace

void QuantDequantizeRow(const QuantGemmArgs& args, int64_t j, float* out) {
  const int64_t groups = QuantNumGroups(args.k, args.group_size);
  const float* scales = args.scales + j * groups;
  const uint8_t* codes = args.w + j * QuantRowBytes(args.code, args.k);
  for (int64_t kk = 0; kk < args.k; ++kk) {
    const int64_t g = kk / args.group_size;
    float q = 0.0f;
    switch (args.code) {
      case QuantCode::kFp8E4M3:
        q = Fp8E4M3ToF32(codes[kk]);
        break;
      case QuantCode::kInt8:
        q = static_cast<float>(static_cast<int8_t>(codes[kk]));
        break;
      case QuantCode::kUint4: {
        const uint8_t byte = codes[kk / 2];
        const int nibble = (kk % 2 == 0) ? (byte & 0xf) : (byte >> 4);
        const int zero = args.zeros != nullptr ? args.zeros[j * groups + g] : kSymmetricInt4Zero;
        q = static_cast<float>(nibble - zero);
        break;
      }
    }
    out[kk] = q * scales[g];
  }
}

void QuantizeActivationRow(ActQuant act_quant, int64_t act_group_size, int64_t k, float* x) {
  if (act_quant == ActQuant::kNone) return;
  const int64_t group = act_quant == ActQuant::kFp8PerToken ? k : act_group_size;
  for (int64_t k0 = 0; k0 < k; k0 += group) QuantizeGroup(x + k0, std::min(group, k - k0));
}

int64_t QuantTc16Bytes(QuantCode code, int64_t n, int64_t k) {
  return (n + 15) / 16 * QuantRowBytes(code, k) * 16;
}

int64_t QuantTc16Offset(QuantCode code, int64_t k, int64_t j, int64_t byte) {
  const int64_t chunks = QuantRowBytes(code, k) / 64;
  const int64_t tile = j / 16, h = j % 16 / 8, g = j % 8;
  const int64_t chunk = byte / 64, t = byte % 64 / 16;
  return ((tile * chunks + chunk) * 2 + h) * 512 + 16 * (4 * g + t) + byte % 16;
}

void QuantGemmRef(const QuantGemmArgs& args) {
  CHECK(args.layout == QuantLayout::kRowMajor) << "QuantGemmRef: row-major codes only";
  CHECK(IsF32OrBf16(args.a_dtype) && IsF32OrBf16(args.c_dtype))
      << "QuantGemmRef: a and c must be kF32 or kBF16";
  CHECK(args.group_size >= 1) << "QuantGemmRef: group_size " << args.group_size;
  CHECK(args.code == QuantCode::kUint4 || args.zeros == nullptr)
      << "QuantGemmRef: zero points are for kUint4 only";
  CHECK(args.act_quant != ActQuant::kFp8PerTokenGroup || args.act_group_size >= 1);
  if (args.m <= 0 || args.n <= 0) return;
  std::vector<float> a32(args.m * args.k);
  ParallelFor(args.m, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      float* row = a32.data() + i * args.k;
      for (int64_t kk = 0; kk < args.k; ++kk)
        row[kk] = LoadElem(args.a, args.a_dtype, i * args.k + kk);
      QuantizeActivationRow(args.act_quant, args.act_group_size, args.k, row);
    }
  });
  const int64_t num_blocks = (args.n + kNBlock - 1) / kNBlock;
  ParallelFor(num_blocks, 1, [&](int64_t b, int64_t e) {
    for (int64_t blk = b; blk < e; ++blk) ColumnBlock(args, a32.data(), blk * kNBlock);
  });
}

}  // namespace tandem
