// wgmma (sm_90a) pieces of the Hopper prefill kernel: shared-memory matrix descriptors for
// 128-byte-swizzled tiles and the two m64n128k16 bf16 -> fp32 shapes it issues.
//
// Tiles. Every operand tile in shared memory is a stack of "half blocks": rows of 64 bf16
// (128 bytes), 1024-byte aligned, with the 16-byte chunk c of row r stored at chunk c ^ (r % 8)
// (the TMA's CU_TENSOR_MAP_SWIZZLE_128B pattern; Swizzle<3,4,3>). A 128-wide head_dim row is
// split over two half blocks (dims 0..63, 64..127).
//
// Descriptors (PTX "matrix descriptor"): start address >> 4 in bits 0-13, leading-dimension byte
// offset >> 4 in bits 16-29, stride-dimension byte offset >> 4 in bits 32-45, swizzle mode in
// bits 62-63 (1 = 128B).
//   K-major operand (Q as A, K as B of S = Q K^T; the reduction dim is contiguous): 8-row core
//   groups 1024 bytes apart -> SBO = 1024; LBO unused with swizzling (1). A k16 step inside the
//   128-byte row advances the start address by 32 bytes; dims 64.. use the next half block.
//   MN-major operand (V as B of O += P V, stored [key][dim]; N = dims contiguous, transposed
//   flag set): 8-key groups 1024 bytes apart -> SBO = 1024; the next 64 dims (the second half
//   block) at LBO = half-block bytes. A k16 step (16 keys) advances the start by 16 rows.
//
// Register fragments (per warp w of the warpgroup, g = lane / 4, q = lane % 4):
//   accumulator d[4 j + e] of m64nN: row 16 w + g + 8 (e / 2), column 8 j + 2 q + (e % 2);
//   A from registers (m64k16, bf16 pairs): a0 (row g, k 2q..), a1 (row g+8, k 2q..),
//   a2 (row g, k 2q+8..), a3 (row g+8, k 2q+8..) — the mma.m16n8k16 A layout.
#pragma once

#include <cstdint>

#include "kernels/paged_attention/tma_util.cuh"

namespace tandem::attention::sm90 {

constexpr uint32_t kSwizzleAtomBytes = 1024;  // 8 rows x 128 bytes

__device__ __forceinline__ uint64_t SmemDesc(const void* tile, uint32_t lbo_bytes,
                                             uint32_t sbo_bytes) {
  const uint32_t addr = CvtaShared(tile);
  uint64_t desc = (addr & 0x3FFFF) >> 4;
  desc |= uint64_t{(lbo_bytes >> 4) & 0x3FFF} << 16;
  desc |= uint64_t{(sbo_bytes >> 4) & 0x3FFF} << 32;
  desc |= uint64_t{1} << 62;  // 128-byte swizzle
  return desc;
}

// A descriptor split into its two 32-bit words, so that a kernel computes the address word of a
// tile once and reaches its sub-tiles by adding (byte offset >> 4) to it: shared addresses are
// below 2^18, so the 14-bit address field never carries into the LBO field.
__device__ __forceinline__ uint32_t DescLo(const void* tile, uint32_t lbo_bytes) {
  return ((CvtaShared(tile) & 0x3FFFF) >> 4) | (((lbo_bytes >> 4) & 0x3FFF) << 16);
}
constexpr uint32_t kDescHi128B = (kSwizzleAtomBytes >> 4) | (1u << 30);  // SBO 1024, 128B swizzle
__device__ __forceinline__ uint64_t Desc(uint32_t lo) { return (uint64_t{kDescHi128B} << 32) | lo; }

// Orders register writes before the wgmma that read them (accumulators, A fragments).
__device__ __forceinline__ void WgmmaFence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void WgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void WgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Keeps the compiler from moving accumulator reads/writes across a wgmma boundary.
__device__ __forceinline__ void FenceRegs(float (&d)[64]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The 64 fp32 accumulators of an m64n128 wgmma tile: their PTX operand list (%0..%63) and the
// matching in-out asm operands, shared by the two wgmma forms below.
#define TANDEM_WGMMA_D64_REGS                                                                   \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "  \
  "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "  \
  "%56, %57, %58, %59, %60, %61, %62, %63}, "
#define TANDEM_WGMMA_D64(d)                                                                       \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),    \
      "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),  \
      "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),  \
      "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),  \
      "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),  \
      "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),  \
      "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),  \
      "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

// S/O += A * B for one m64n128k16 step: A (64 x 16) through descriptor `a`, B (16 x 128)
// through descriptor `b`, K-major (no transpose). `accumulate` == 0 overwrites d.
__device__ __forceinline__ void WgmmaSs(float (&d)[64], uint64_t a, uint64_t b, int accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred acc;\n"
      "setp.ne.b32 acc, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " TANDEM_WGMMA_D64_REGS
      "%64, %65, acc, 1, 1, 0, 0;\n"
      "}\n"
      : TANDEM_WGMMA_D64(d)
      : "l"(a), "l"(b), "r"(accumulate));
}

// d += A * B for one m64n128k16 step: A (64 x 16) from registers (the mma.m16n8k16 A fragment
// of each warp's 16 rows), B (16 x 128) through descriptor `b`, MN-major (transposed: B is
// stored [k][n], n contiguous).
__device__ __forceinline__ void WgmmaRsTransB(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "{\n"
      ".reg .pred acc;\n"
      "setp.ne.b32 acc, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " TANDEM_WGMMA_D64_REGS
      "{%64, %65, %66, %67}, %68, acc, 1, 1, 1;\n"
      "}\n"
      : TANDEM_WGMMA_D64(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}

#undef TANDEM_WGMMA_D64_REGS
#undef TANDEM_WGMMA_D64

}  // namespace tandem::attention::sm90
