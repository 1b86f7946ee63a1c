#include "tokenizer/training_corpus.h"

#include <string>

namespace tandem {
namespace {

// Written for this project. Varied on purpose: repeated words give frequent merges, rare
// characters stay unmerged (and, for SentencePiece-style files, fall back to bytes).
constexpr std::string_view kEnglish = R"(The quick brown fox jumps over the lazy dog.
A language model reads a prompt, turns it into tokens, and predicts the next token again and again.
The server keeps the key and value cache in pages, so that many requests can share the same memory.
When the prefill worker finishes a prompt, it sends the pages to the decode worker over the network.
Tokens stream back to the user one at a time; the first token should arrive quickly.
It was the best of plans, it was the simplest of plans: measure first, then optimize what matters.
She said, "Don't worry, we'll test it again tomorrow." He replied: "I've already tested it twice!"
Questions? Answers! Lists: apples, oranges, pears; numbers: one, two, three... and so on.
In the morning the engineers read the logs; in the evening they wrote the report for the team.
There is nothing more practical than a good theory, and nothing more convincing than a benchmark.
Reading, writing, testing, building, running, serving, streaming, batching, scheduling, sampling.
The weather today is sunny with a light breeze from the west, and the temperature is rising.
Please remember to commit your changes, run the tests, and write a short note about what changed.
)";

constexpr std::string_view kCode = R"(def tokenize(text: str) -> list[int]:
    """Split text into words and map each word to ids."""
    ids = []
    for word in text.split():
        ids.extend(vocab.get(word, [unk_id]))
    return ids

int main(int argc, char** argv) {
  std::vector<int32_t> tokens = tokenizer->Encode(prompt, /*add_special_tokens=*/true);
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] == eos_id) break;
    printf("%d: %s\n", static_cast<int>(i), Decode({tokens[i]}).c_str());
  }
  return 0;
}

{"model": "tiny", "max_tokens": 128, "temperature": 0.7, "stream": true, "stop": ["\n\n"]}
SELECT name, count(*) FROM requests WHERE status = 'finished' GROUP BY name ORDER BY 2 DESC;
	if (x != nullptr && y >= 0) { return x->value + y; }  // tabs and operators: <= >= == != && ||
)";

constexpr std::string_view kNumbers =
    R"(On 2024-03-15 at 09:30:00 the cluster served 12,345 requests; p99 latency was 187.5 ms.
Prices: $3.99, €12.50, £7, ¥1200. Phone: +1 (555) 010-9999. Version 3.11.2, build 20231104.
1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 42 64 100 128 256 512 1024 2048 4096 8192
3.14159 2.71828 1.41421 0.57721 1e-6 6.02e23 0x7FFF 0b1010 99% 50/50 24/7 1,000,000
)";

constexpr std::string_view kLatin =
    R"(Le café est très chaud ; l'élève a déjà commencé à étudier la leçon près de la fenêtre.
Où est la bibliothèque ? Ça dépend : à gauche, puis tout droit, après le théâtre.
Die Straße ist schön, und die Brücke über den Fluss ist größer als früher. Grüße aus München!
Übung macht den Meister; Äpfel und Öl sind günstig, sagt der Bäcker.
El niño comió una manzana en la mañana. ¿Dónde está la estación? ¡Qué día tan bonito!
A canção de ninar acalmou a criança; não há coração sem emoção. Ação e reação.
Zażółć gęślą jaźń. Český jazyk má háčky a čárky. Ærø og Øresund ligger i Danmark. Smørrebrød.
)";

constexpr std::string_view kOtherScripts =
    R"(Привет, мир! Сегодня хорошая погода, и мы идём гулять в парк.
Γειά σου κόσμε! Η γλώσσα είναι όμορφη. Καλημέρα σε όλους.
مرحبا بالعالم. اللغة العربية جميلة.
שלום עולם. ‏זה טקסט בעברית.
नमस्ते दुनिया। आज मौसम अच्छा है।
)";

constexpr std::string_view kCjk = R"(你好，世界！今天天气很好，我们一起去公园散步吧。
模型读取提示词，把它变成词元，然后一次又一次地预测下一个词元。
服务器把键值缓存分成页面，这样许多请求可以共享同一块内存。
中文分词很有意思：一个字可以是一个词，两个字也可以组成一个词。
こんにちは、世界！今日はいい天気ですね。東京の桜はとてもきれいです。
モデルはトークンを一つずつ生成します。テストを書いてから実装しましょう。
안녕하세요, 세계! 오늘 날씨가 정말 좋네요. 한국어도 지원합니다.
)";

constexpr std::string_view kEmoji =
    R"(Great job! 🎉🎉 Thanks 🙏 I love it ❤️ 😀😃😄 so fast 🚀🚀🚀 fire 🔥 ok 👍👍🏽
Family: 👨‍👩‍👧‍👦 flags: 🇫🇷 🇯🇵 🇺🇸 weather: ☀️ 🌧️ ❄️ food: 🍕🍣🍜 ☕ check ✅ cross ❌ warning ⚠️
Math: ∑ ∫ √ ∞ ≈ ≠ ≤ ≥ π α β γ δ λ μ σ Ω → ← ↔ ⇒ • … – — “quotes” ‘single’ «guillemets»
)";

}  // namespace

std::string_view TrainingCorpus() {
  static const std::string* corpus = [] {
    auto* text = new std::string();
    // Repetition weights the common scripts, as real training data would.
    for (int i = 0; i < 3; ++i) *text += std::string(kEnglish);
    for (int i = 0; i < 2; ++i) *text += std::string(kCode);
    *text += std::string(kNumbers);
    for (int i = 0; i < 2; ++i) *text += std::string(kLatin);
    *text += std::string(kOtherScripts);
    for (int i = 0; i < 2; ++i) *text += std::string(kCjk);
    *text += std::string(kEmoji);
    return text;
  }();
  return *corpus;
}

}  // namespace tandem
