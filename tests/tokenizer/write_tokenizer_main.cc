// write_tokenizer DIR FAMILY [VOCAB_SIZE]: writes a generated tokenizer (for the golden script
// and for manual checks against the `tokenizers` package).
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tokenizer/tokenizer.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s DIR llama3|qwen2|llama2|mistral [VOCAB_SIZE]\n", argv[0]);
    return 2;
  }
  const std::string name = argv[2];
  tandem::TokenizerFamily family;
  if (name == "llama3") {
    family = tandem::TokenizerFamily::kLlama3;
  } else if (name == "qwen2") {
    family = tandem::TokenizerFamily::kQwen2;
  } else if (name == "llama2") {
    family = tandem::TokenizerFamily::kLlama2;
  } else if (name == "mistral") {
    family = tandem::TokenizerFamily::kMistral;
  } else {
    std::fprintf(stderr, "unknown family %s\n", name.c_str());
    return 2;
  }
  tandem::TokenizerSpec spec;
  if (argc > 3) spec.vocab_size = std::atoi(argv[3]);
  tandem::GeneratedTokenizerInfo info;
  const absl::Status status = tandem::WriteTokenizerFiles(argv[1], family, spec, &info);
  if (!status.ok()) {
    std::fprintf(stderr, "%s\n", status.ToString().c_str());
    return 1;
  }
  std::printf("vocab_size=%d bos=%d eos=%d\n", info.vocab_size, info.bos_id.value_or(-1),
              info.eos_ids.empty() ? -1 : info.eos_ids[0]);
  return 0;
}
