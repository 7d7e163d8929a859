// Prefixes shared between an MPI sweep's workers through rank 0 (sweep_prefix_share.h).
#include "harness/sweep_prefix_share.h"

#include <algorithm>
#include <charconv>

#include "common/error.h"
#include "harness/sweep_affinity.h"

namespace kvb::harness {

std::string prefix_message(int model, std::string_view body) {
  std::string m(kPrefixMessageHead);
  m += std::to_string(model);
  m += '\n';
  m.append(body);
  return m;
}

bool is_prefix_message(std::string_view msg) { return msg.starts_with(kPrefixMessageHead); }

PrefixMessage parse_prefix_message(std::string_view msg) {
  KVB_CHECK(is_prefix_message(msg)) << "not a prefix message";
  const size_t nl = msg.find('\n');
  KVB_CHECK(nl != std::string_view::npos && nl > kPrefixMessageHead.size() && nl < 24)
      << "a prefix message without its model line";
  PrefixMessage m;
  const char* first = msg.data() + kPrefixMessageHead.size();
  const auto [end, ec] = std::from_chars(first, msg.data() + nl, m.model);
  KVB_CHECK(ec == std::errc() && end == msg.data() + nl && m.model >= 0)
      << "a prefix message's model line is not a model index";
  m.body = msg.substr(nl + 1);
  return m;
}

SharedPrefixes::SharedPrefixes(std::vector<std::vector<uint64_t>> chains, size_t max_bytes)
    : chains_(std::move(chains)), max_bytes_(max_bytes) {}

void SharedPrefixes::add(int source, int bundle, int model, int tokens, std::string message) {
  KVB_CHECK(bundle >= 0 && static_cast<size_t>(bundle) < chains_.size())
      << "a prefix of bundle " << bundle << ", which has no prefix chain";
  ++received_;
  received_bytes_ += message.size();
  if (message.size() > max_bytes_) return;
  Kept k;
  k.id = next_id_++;
  k.source = source;
  k.bundle = bundle;
  k.model = model;
  k.blocks = tokens / kPrefixBlock;
  k.message = std::move(message);
  bytes_ += k.message.size();
  kept_.push_back(std::move(k));
  while (bytes_ > max_bytes_) {
    bytes_ -= kept_.front().message.size();
    kept_.pop_front();
  }
}

int common_blocks(const std::vector<uint64_t>& a, const std::vector<uint64_t>& b) {
  const size_t limit = std::min(a.size(), b.size());
  size_t d = 0;
  while (d < limit && a[d] == b[d]) ++d;
  return static_cast<int>(d);
}

bool worth_waiting(double remaining_ms, double ms_per_token, int now_blocks, int later_blocks) {
  if (ms_per_token <= 0 || later_blocks < now_blocks + SharedPrefixes::kMinShared) return false;
  return remaining_ms < ms_per_token * kPrefixBlock * (later_blocks - now_blocks);
}

std::pair<SharedPrefixes::Kept*, int> SharedPrefixes::find(int worker, int bundle, int model,
                                                           int own_blocks) {
  KVB_CHECK(bundle >= 0 && static_cast<size_t>(bundle) < chains_.size())
      << "bundle " << bundle << " has no prefix chain";
  Kept* best = nullptr;
  int best_blocks = std::max(kMinShared - 1, own_blocks);
  for (Kept& k : kept_) {  // oldest first: a later one of equal depth wins
    if (k.source == worker || k.model != model || k.sent_to.count(worker)) continue;
    const int d = std::min(common_blocks(chains_[bundle], chains_[k.bundle]), k.blocks);
    if (d > best_blocks || (best != nullptr && d == best_blocks)) {
      best = &k;
      best_blocks = d;
    }
  }
  return {best, best == nullptr ? 0 : best_blocks};
}

int SharedPrefixes::best_blocks(int worker, int bundle, int model) {
  return find(worker, bundle, model, 0).second;
}

const std::string* SharedPrefixes::pick(int worker, int bundle, int model, int own_blocks) {
  Kept* best = find(worker, bundle, model, own_blocks).first;
  if (best == nullptr) return nullptr;
  best->sent_to.insert(worker);
  ++sent_;
  sent_bytes_ += best->message.size();
  return &best->message;
}

}  // namespace kvb::harness
