#include "engine/model/weights.h"

#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "base/thread_pool.h"
#include "engine/model/hf_tensors.h"
#include "engine/model/quant_checkpoint.h"

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

class Loader {
 public:
  Loader(const SafetensorsCheckpoint& ckpt, const ModelConfig& config, DType dtype,
         const QuantConfig& quant)
      : ckpt_(ckpt), dtype_(dtype), quant_(quant) {
    for (const HfTensor& t : HfTensors(config)) expected_[t.spec.name] = t.spec.shape;
  }

  // Concatenates the named tensors along dim 0 into one tensor of the compute dtype.
  absl::StatusOr<HostTensor> Load(const std::vector<std::string>& names) {
    return LoadAs(names, dtype_);
  }

  // A (fused) linear weight from the "<module>.weight" names: quantized when quant_ says so.
  absl::StatusOr<HostTensor> LoadLinear(const std::vector<std::string>& names) {
    if (!quant_.quantized()) return Load(names);
    std::vector<QuantizedWeight> parts;
    for (const std::string& name : names) {
      const std::vector<int64_t>& shape = expected_.at(name);
      if (quant_.load_time()) {
        ASSIGN_OR_RETURN(HostTensor dense, LoadAs({name}, DType::kF32));
        const QuantCode code =
            quant_.format == QuantConfig::Format::kLoadTimeFp8    ? QuantCode::kFp8E4M3
            : quant_.format == QuantConfig::Format::kLoadTimeInt8 ? QuantCode::kInt8
                                                                  : QuantCode::kUint4;
        parts.push_back(QuantizeWeight(reinterpret_cast<const float*>(dense.data()), shape[0],
                                       shape[1], code, quant_.group_size));
        parts.back().act_quant = quant_.act_quant;
      } else {
        const std::string module = name.substr(0, name.size() - std::string(".weight").size());
        ASSIGN_OR_RETURN(QuantizedWeight w,
                         ReadQuantizedLinear(ckpt_, quant_, module, shape[0], shape[1]));
        parts.push_back(std::move(w));
      }
    }
    ASSIGN_OR_RETURN(QuantizedWeight fused, ConcatRows(std::move(parts), names.front()));
    HostTensor out;
    out.shape = {fused.n, fused.k};
    out.quant = std::make_shared<const QuantizedWeight>(std::move(fused));
    return out;
  }

 private:
  absl::StatusOr<HostTensor> LoadAs(const std::vector<std::string>& names, DType dtype) {
    std::vector<SafetensorsCheckpoint::Entry> entries;
    HostTensor out;
    out.dtype = dtype;
    int64_t rows = 0, elems = 0;
    for (const std::string& name : names) {
      ASSIGN_OR_RETURN(SafetensorsCheckpoint::Entry e, Check(name));
      entries.push_back(e);
      rows += e.info->shape[0];
      elems += e.info->NumElements();
      out.shape = e.info->shape;
    }
    out.shape[0] = rows;
    out.bytes.resize(elems * DTypeSize(dtype));
    uint8_t* dst = out.bytes.data();
    for (const auto& e : entries) {
      Convert(e.file->Data(*e.info), e.info->dtype, e.info->NumElements(), dtype, dst);
      dst += e.info->NumElements() * DTypeSize(dtype);
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

  const SafetensorsCheckpoint& ckpt_;
  DType dtype_;
  const QuantConfig& quant_;
  std::map<std::string, std::vector<int64_t>> expected_;
};

absl::StatusOr<LayerWeights> LoadLayer(Loader& loader, const ModelConfig& c, int layer) {
  const std::string p = LayerPrefix(layer);
  const std::string attn = p + "self_attn.";
  LayerWeights w;
  ASSIGN_OR_RETURN(w.qkv_proj, loader.LoadLinear({attn + "q_proj.weight", attn + "k_proj.weight",
                                                  attn + "v_proj.weight"}));
  if (c.qkv_bias) {
    ASSIGN_OR_RETURN(w.qkv_bias, loader.Load({attn + "q_proj.bias", attn + "k_proj.bias",
                                              attn + "v_proj.bias"}));
  }
  ASSIGN_OR_RETURN(w.o_proj, loader.LoadLinear({attn + "o_proj.weight"}));
  if (c.qk_norm) {
    ASSIGN_OR_RETURN(w.q_norm, loader.Load({attn + "q_norm.weight"}));
    ASSIGN_OR_RETURN(w.k_norm, loader.Load({attn + "k_norm.weight"}));
  }
  ASSIGN_OR_RETURN(w.gate_up_proj,
                   loader.LoadLinear({p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"}));
  ASSIGN_OR_RETURN(w.down_proj, loader.LoadLinear({p + "mlp.down_proj.weight"}));
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
                                         const ModelConfig& config, DType compute_dtype) {
  return LoadWeights(checkpoint, config, compute_dtype, QuantConfig{});
}

absl::StatusOr<ModelWeights> LoadWeights(const SafetensorsCheckpoint& checkpoint,
                                         const ModelConfig& config, DType compute_dtype,
                                         const QuantConfig& quant) {
  if (compute_dtype != DType::kF32 && compute_dtype != DType::kBF16) {
    return absl::InvalidArgumentError("LoadWeights: compute dtype must be F32 or BF16");
  }
  Loader loader(checkpoint, config, compute_dtype, quant);
  ModelWeights w;
  ASSIGN_OR_RETURN(w.embed_tokens, loader.Load({"model.embed_tokens.weight"}));
  for (int l = 0; l < config.num_layers; ++l) {
    ASSIGN_OR_RETURN(LayerWeights layer, LoadLayer(loader, config, l));
    w.layers.push_back(std::move(layer));
  }
  ASSIGN_OR_RETURN(w.norm, loader.Load({"model.norm.weight"}));
  if (!config.tie_word_embeddings) {
    ASSIGN_OR_RETURN(w.lm_head, loader.Load({"lm_head.weight"}));
  }
  return w;
}

}  // namespace tandem
