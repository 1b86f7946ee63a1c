// HfTokenizer: the Tokenizer built from a tokenizer.json, running the same pipeline as the
// `tokenizers` package: added-token split → normalizer → pre-tokenizer → BPE → post-processor;
// decoding: ids → token strings → decoder chain.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "tokenizer/added_vocabulary.h"
#include "tokenizer/bpe_model.h"
#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/post_processor.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace tandem {

class HfTokenizer : public Tokenizer {
 public:
  struct Parts {
    std::unique_ptr<Normalizer> normalizer;       // may be null
    std::unique_ptr<PreTokenizer> pre_tokenizer;  // may be null
    std::unique_ptr<BpeModel> model;
    PostProcessor post_processor;
    std::unique_ptr<Decoder> decoder;  // may be null: tokens joined with spaces
    AddedVocabulary added;
    std::optional<int32_t> bos_id, eos_id;
  };
  explicit HfTokenizer(Parts parts);
  // From tokenizer_config.json's bos_token / eos_token (set once, right after construction).
  void SetSpecialIds(std::optional<int32_t> bos, std::optional<int32_t> eos) {
    p_.bos_id = bos;
    p_.eos_id = eos;
  }

  std::vector<int32_t> Encode(std::string_view text, bool add_special_tokens) const override;
  std::string Decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const override;
  int vocab_size() const override { return vocab_size_; }
  std::optional<int32_t> TokenToId(std::string_view token) const override;
  bool IsSpecial(int32_t id) const override;
  std::optional<int32_t> bos_id() const override { return p_.bos_id; }
  std::optional<int32_t> eos_id() const override { return p_.eos_id; }
  const PostProcessor& post_processor() const { return p_.post_processor; }

 private:
  // Text between raw-matched added tokens: normalize, split off normalized added tokens,
  // encode the rest.
  void EncodeText(std::string_view text, bool at_origin, std::vector<int32_t>* ids) const;
  // Pre-tokenizes and runs the model on already-normalized text.
  void EncodeNormalized(std::string normalized, bool at_origin, std::vector<int32_t>* ids) const;

  Parts p_;
  int vocab_size_ = 0;
};

}  // namespace tandem
