#include "engine/model/weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "base/thread_pool.h"
#include "engine/model/hf_tensors.h"
#include "engine/model/quant_checkpoint.h"
#include "engine/model/quant_shard.h"

namespace tandem {
namespace {

// Converts n elements from `src` (BF16/F16/F32) to `dst` (F32/BF16), in parallel.
void Convert(const uint8_t* src, DType src_dtype, int64_t n, DType dst_dtype, uint8_t* dst) {
  if (src_dtype == dst_dtype) {
    std::memcpy(dst, src, n * DTypeSize(src_dtype));
    return;
  }
  ParallelFor(n, int64_t{1} << 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      float v;
      if (src_dtype == DType::kF32) {
        std::memcpy(&v, src + 4 * i, 4);
      } else {
        uint16_t bits;
        std::memcpy(&bits, src + 2 * i, 2);
        v = src_dtype == DType::kBF16 ? Bf16ToF32(bits) : F16ToF32(bits);
      }
      if (dst_dtype == DType::kF32) {
        std::memcpy(dst + 4 * i, &v, 4);
      } else {
        const uint16_t bits = F32ToBf16(v);
        std::memcpy(dst + 2 * i, &bits, 2);
      }
    }
  });
}

using Slice = TensorSlice;
struct Part {
  Part(std::string n, Slice s = {}) : name(std::move(n)), slice(s) {}  // NOLINT: implicit
  Part(const char* n) : name(n) {}                                     // NOLINT: implicit
  std::string name;
  Slice slice;
};

// Converts `slice` of the tensor `e` into `dst`; returns the end of what it wrote. Only the
// slice's bytes of the (mapped) file are read.
uint8_t* ConvertSlice(const SafetensorsCheckpoint::Entry& e, const Slice& slice, uint8_t* dst,
                      DType dtype) {
  const uint8_t* src = e.file->Data(*e.info);
  const DType src_dtype = e.info->dtype;
  const int64_t src_size = DTypeSize(src_dtype);
  const int64_t dst_size = DTypeSize(dtype);
  if (slice.dim < 0) {
    Convert(src, src_dtype, e.info->NumElements(), dtype, dst);
    return dst + e.info->NumElements() * dst_size;
  }
  const int64_t rows = e.info->shape[0];
  const int64_t row_elems = e.info->NumElements() / std::max<int64_t>(rows, 1);
  if (slice.dim == 0) {
    Convert(src + slice.begin * row_elems * src_size, src_dtype, slice.count * row_elems, dtype,
            dst);
    return dst + slice.count * row_elems * dst_size;
  }
  for (int64_t r = 0; r < rows; ++r) {  // dim 1 of a 2-D weight: a run of each row
    Convert(src + (r * row_elems + slice.begin) * src_size, src_dtype, slice.count, dtype, dst);
    dst += slice.count * dst_size;
  }
  return dst;
}

// max |w| of each row of the 2-D float tensor `e` (BF16/F16/F32), streamed from the mapped file.
std::vector<float> RowAbsMax(const SafetensorsCheckpoint::Entry& e) {
  const int64_t rows = e.info->shape[0], cols = e.info->shape[1];
  const uint8_t* src = e.file->Data(*e.info);
  const DType t = e.info->dtype;
  std::vector<float> amax(rows, 0.0f);
  ParallelFor(rows, 16, [&](int64_t b, int64_t end) {
    for (int64_t r = b; r < end; ++r) {
      for (int64_t i = r * cols; i < (r + 1) * cols; ++i) {
        float v;
        if (t == DType::kF32) {
          std::memcpy(&v, src + 4 * i, 4);
        } else {
          uint16_t bits;
          std::memcpy(&bits, src + 2 * i, 2);
          v = t == DType::kBF16 ? Bf16ToF32(bits) : F16ToF32(bits);
        }
        amax[r] = std::max(amax[r], std::fabs(v));
      }
    }
  });
  return amax;
}

class Loader {
 public:
  Loader(const SafetensorsCheckpoint& ckpt, const ModelConfig& config, DType dtype,
         const QuantConfig& quant, int tp)
      : ckpt_(ckpt), dtype_(dtype), quant_(quant), tp_(tp) {
    for (const HfTensor& t : HfTensors(config)) expected_[t.spec.name] = t.spec.shape;
  }

  // Concatenates the named tensors (or the slices of them a tensor-parallel rank holds) along
  // dim 0 into one tensor of the compute dtype.
  absl::StatusOr<HostTensor> Load(const std::vector<Part>& parts) { return LoadAs(parts, dtype_); }

  // A (fused) linear weight from the "<module>.weight" parts (or their slices): quantized when
  // quant_ says so, each part read in its format's layout or quantized at load, then fused.
  absl::StatusOr<HostTensor> LoadLinear(const std::vector<Part>& parts) {
    if (!quant_.quantized()) return Load(parts);
    std::vector<QuantizedWeight> quantized;
    for (const Part& part : parts) {
      const std::vector<int64_t>& shape = expected_.at(part.name);
      const std::string module = part.name.substr(0, part.name.size() - kWeightSuffix.size());
      if (quant_.load_time()) {
        ASSIGN_OR_RETURN(QuantizedWeight w, QuantizeAtLoad(part, module));
        quantized.push_back(std::move(w));
      } else {
        ASSIGN_OR_RETURN(QuantizedWeight w, ReadQuantizedLinear(ckpt_, quant_, module, shape[0],
                                                                shape[1], part.slice, tp_));
        quantized.push_back(std::move(w));
      }
    }
    ASSIGN_OR_RETURN(QuantizedWeight fused, ConcatRows(std::move(quantized), parts.front().name));
    HostTensor out;
    out.shape = {fused.n, fused.k};
    out.quant = std::make_shared<const QuantizedWeight>(std::move(fused));
    return out;
  }

 private:
  absl::StatusOr<HostTensor> LoadAs(const std::vector<Part>& parts, DType dtype) {
    std::vector<SafetensorsCheckpoint::Entry> entries;
    HostTensor out;
    out.dtype = dtype;
    int64_t rows = 0, elems = 0;
    for (const Part& part : parts) {
      ASSIGN_OR_RETURN(SafetensorsCheckpoint::Entry e, Check(part.name));
      entries.push_back(e);
      std::vector<int64_t> shape = e.info->shape;
      if (part.slice.dim >= 0) shape[part.slice.dim] = part.slice.count;
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      rows += shape[0];
      elems += n;
      out.shape = shape;
    }
    out.shape[0] = rows;
    out.bytes.resize(elems * DTypeSize(dtype));
    uint8_t* dst = out.bytes.data();
    for (size_t i = 0; i < entries.size(); ++i) {
      dst = ConvertSlice(entries[i], parts[i].slice, dst, dtype);
    }
    return out;
  }

  absl::StatusOr<SafetensorsCheckpoint::Entry> Check(const std::string& name) {
    const std::vector<int64_t>& want = expected_.at(name);
    const SafetensorsCheckpoint::Entry e = ckpt_.Find(name);
    const std::string want_str = "[" + absl::StrJoin(want, ", ") + "]";
    if (e.file == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": missing from the checkpoint (expected ", want_str, ")"));
    }
    const DType t = e.info->dtype;
    if (t != DType::kBF16 && t != DType::kF16 && t != DType::kF32) {
      return absl::InvalidArgumentError(absl::StrCat(name, " in ", e.file->path(), ": dtype ",
                                                     std::string(DTypeName(t)), " is not supported",
                                                     " (expected BF16, F16 or F32)"));
    }
    if (e.info->shape != want) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": expected ", want_str, ", found ",
                                                     e.info->ShapeString(), " in ",
                                                     e.file->path()));
    }
    return e;
  }

  // --quantization: the part (the rank's slice only) loaded as fp32 and quantized, equal to the
  // same slice of the whole weight quantized (quant_shard.h: a cut the format cannot take is
  // InvalidArgument). A row-parallel slice of a per-channel format takes the whole rows' max
  // |w| (RowAbsMax: the whole tensor is read, never held).
  absl::StatusOr<QuantizedWeight> QuantizeAtLoad(const Part& part, const std::string& module) {
    const std::vector<int64_t>& shape = expected_.at(part.name);
    RETURN_IF_ERROR(CheckQuantSlice(quant_, module, shape[0], shape[1], part.slice, tp_));
    const QuantCode code = quant_.format == QuantConfig::Format::kLoadTimeFp8 ? QuantCode::kFp8E4M3
                           : quant_.format == QuantConfig::Format::kLoadTimeInt8
                               ? QuantCode::kInt8
                               : QuantCode::kUint4;
    std::vector<float> row_amax;
    if (part.slice.dim == 1 && code != QuantCode::kUint4) {
      ASSIGN_OR_RETURN(SafetensorsCheckpoint::Entry e, Check(part.name));
      row_amax = RowAbsMax(e);
    }
    ASSIGN_OR_RETURN(HostTensor dense, LoadAs({part}, DType::kF32));
    QuantizedWeight w =
        QuantizeWeight(reinterpret_cast<const float*>(dense.data()), dense.shape[0], dense.shape[1],
                       code, quant_.group_size, row_amax.empty() ? nullptr : row_amax.data());
    w.act_quant = quant_.act_quant;
    return w;
  }

  static constexpr std::string_view kWeightSuffix = ".weight";

  const SafetensorsCheckpoint& ckpt_;
  DType dtype_;
  const QuantConfig& quant_;
  int tp_;  // tensor-parallel size (error messages)
  std::map<std::string, std::vector<int64_t>> expected_;
};

// The slices of one layer's weights that `shard` holds (tensor_shard.h); whole tensors at TP 1.
struct LayerSlices {
  Slice q, kv, gate_up;  // dim 0: column-parallel
  Slice o, down;         // dim 1: row-parallel
};

LayerSlices SlicesFor(const ModelConfig& c, TensorShard shard) {
  if (shard.whole()) return {};
  const ModelConfig s = ShardConfig(c, shard.size);
  const int64_t d = c.head_dim;
  const int64_t q_begin = FirstQHead(c, shard) * d;
  const int64_t inter_begin = FirstIntermediate(c, shard);
  return LayerSlices{.q = {0, q_begin, s.num_q_heads * d},
                     .kv = {0, FirstKvHead(c, shard) * d, s.num_kv_heads * d},
                     .gate_up = {0, inter_begin, s.intermediate_size},
                     .o = {1, q_begin, s.num_q_heads * d},
                     .down = {1, inter_begin, s.intermediate_size}};
}

// A bias [n] sliced like the rows of its weight.
Slice BiasSlice(const Slice& rows) {
  return rows.dim < 0 ? rows : Slice{0, rows.begin, rows.count};
}

absl::StatusOr<LayerWeights> LoadLayer(Loader& loader, const ModelConfig& c, int layer,
                                       TensorShard shard) {
  const std::string p = LayerPrefix(layer);
  const std::string attn = p + "self_attn.";
  const LayerSlices sl = SlicesFor(c, shard);
  LayerWeights w;
  ASSIGN_OR_RETURN(w.qkv_proj, loader.LoadLinear({{attn + "q_proj.weight", sl.q},
                                                  {attn + "k_proj.weight", sl.kv},
                                                  {attn + "v_proj.weight", sl.kv}}));
  if (c.qkv_bias) {
    ASSIGN_OR_RETURN(w.qkv_bias, loader.Load({{attn + "q_proj.bias", BiasSlice(sl.q)},
                                              {attn + "k_proj.bias", BiasSlice(sl.kv)},
                                              {attn + "v_proj.bias", BiasSlice(sl.kv)}}));
  }
  ASSIGN_OR_RETURN(w.o_proj, loader.LoadLinear({{attn + "o_proj.weight", sl.o}}));
  if (c.qk_norm) {
    ASSIGN_OR_RETURN(w.q_norm, loader.Load({attn + "q_norm.weight"}));
    ASSIGN_OR_RETURN(w.k_norm, loader.Load({attn + "k_norm.weight"}));
  }
  ASSIGN_OR_RETURN(w.gate_up_proj, loader.LoadLinear({{p + "mlp.gate_proj.weight", sl.gate_up},
                                                      {p + "mlp.up_proj.weight", sl.gate_up}}));
  ASSIGN_OR_RETURN(w.down_proj, loader.LoadLinear({{p + "mlp.down_proj.weight", sl.down}}));
  ASSIGN_OR_RETURN(w.input_layernorm, loader.Load({p + "input_layernorm.weight"}));
  ASSIGN_OR_RETURN(w.post_attention_layernorm,
                   loader.Load({p + "post_attention_layernorm.weight"}));
  return w;
}

}  // namespace

int64_t HostTensor::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<ModelWeights> LoadWeights(const SafetensorsCheckpoint& checkpoint,
                                         const ModelConfig& config, DType compute_dtype,
                                         const QuantConfig& quant) {
  return LoadWeights(checkpoint, config, compute_dtype, TensorShard{}, StageLayers{}, quant);
}

absl::StatusOr<ModelWeights> LoadWeights(const SafetensorsCheckpoint& checkpoint,
                                         const ModelConfig& config, DType compute_dtype,
                                         TensorShard shard, StageLayers stage,
                                         const QuantConfig& quant) {
  if (compute_dtype != DType::kF32 && compute_dtype != DType::kBF16) {
    return absl::InvalidArgumentError("LoadWeights: compute dtype must be F32 or BF16");
  }
  if (shard.rank < 0 || shard.rank >= shard.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("LoadWeights: rank ", shard.rank, " of ", shard.size));
  }
  RETURN_IF_ERROR(CheckTensorParallel(config, shard.size));
  Loader loader(checkpoint, config, compute_dtype, quant, shard.size);
  ModelWeights w;
  if (stage.count < 0) stage.count = config.num_layers;
  if (stage.first < 0 || stage.count < 1 || stage.first + stage.count > config.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("LoadWeights: layers [", stage.first, ", ",
                                                   stage.first + stage.count, ") of ",
                                                   config.num_layers));
  }
  const bool head = stage.last_stage && shard.rank == 0;  // computes the logits
  if (stage.first_stage || (head && config.tie_word_embeddings)) {
    ASSIGN_OR_RETURN(w.embed_tokens, loader.Load({"model.embed_tokens.weight"}));
  }
  for (int l = stage.first; l < stage.first + stage.count; ++l) {
    ASSIGN_OR_RETURN(LayerWeights layer, LoadLayer(loader, config, l, shard));
    w.layers.push_back(std::move(layer));
  }
  if (stage.last_stage) {
    ASSIGN_OR_RETURN(w.norm, loader.Load({"model.norm.weight"}));
  }
  if (!config.tie_word_embeddings && head) {  // rank 0 of the last stage alone computes logits
    ASSIGN_OR_RETURN(w.lm_head, loader.Load({"lm_head.weight"}));
  }
  return w;
}

}  // namespace tandem
