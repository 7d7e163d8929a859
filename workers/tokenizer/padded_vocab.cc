// A tokenizer whose model has more logits rows than the tokenizer has tokens (vocabularies padded
// to a multiple of 64 or 128, or a smaller --tokenizer): ids in [tokenizer size, model size) can
// be sampled and decode to "" with a one-time warning, as HF tokenizers' decode skips ids it does
// not know. Sampling keeps the full row, so token ids stay those of the reference engines
// (transformers' generate, llama.cpp), which sample over every logit as well.
#include <atomic>

#include "common/error.h"
#include "common/log.h"
#include "workers/tokenizer/tokenizer_impl.h"

namespace kvb::tokenizer {
namespace {

class PaddedVocabTokenizer final : public Tokenizer {
 public:
  PaddedVocabTokenizer(std::unique_ptr<Tokenizer> inner, int32_t model_vocab_size)
      : inner_(std::move(inner)), model_vocab_size_(model_vocab_size) {
    bos_id_ = inner_->bos_id();
    eos_id_ = inner_->eos_id();
    end_ids_ = inner_->end_ids();
    default_add_bos_ = inner_->default_add_bos();
  }

  std::vector<int32_t> encode(const std::string& text, const EncodeOptions& opt) const override {
    return inner_->encode(text, opt);
  }
  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const override {
    std::vector<int32_t> known;
    known.reserve(ids.size());
    for (int32_t id : ids) {
      if (!is_padding(id)) known.push_back(id);
    }
    return inner_->decode(known, skip_special);
  }
  std::string token_to_piece(int32_t id, bool skip_special) const override {
    return is_padding(id) ? std::string() : inner_->token_to_piece(id, skip_special);
  }
  std::string token_to_piece_after(int32_t prev, int32_t id, bool skip_special) const override {
    return is_padding(id) ? std::string() : inner_->token_to_piece_after(prev, id, skip_special);
  }
  int32_t vocab_size() const override { return model_vocab_size_; }
  bool is_special(int32_t id) const override { return !is_padding(id) && inner_->is_special(id); }
  int32_t find_token(const std::string& text) const override { return inner_->find_token(text); }

 private:
  // True for ids past the tokenizer but within the model (warning once); ids outside the model
  // go on to the tokenizer, which throws.
  bool is_padding(int32_t id) const {
    if (id < inner_->vocab_size() || id >= model_vocab_size_) return false;
    if (!warned_.exchange(true)) {
      KVB_LOG_WARN << "token id " << id << " is past the tokenizer's " << inner_->vocab_size()
                   << " tokens (the model has " << model_vocab_size_
                   << "): such ids decode to \"\" (warned once)";
    }
    return true;
  }

  std::unique_ptr<Tokenizer> inner_;
  int32_t model_vocab_size_;
  mutable std::atomic<bool> warned_{false};
};

}  // namespace

std::unique_ptr<Tokenizer> pad_vocabulary(std::unique_ptr<Tokenizer> inner,
                                          int32_t model_vocab_size) {
  KVB_CHECK(inner != nullptr && model_vocab_size >= inner->vocab_size())
      << "the model's vocabulary (" << model_vocab_size << ") is smaller than the tokenizer's";
  if (model_vocab_size == inner->vocab_size()) return inner;
  return std::make_unique<PaddedVocabTokenizer>(std::move(inner), model_vocab_size);
}

}  // namespace kvb::tokenizer
