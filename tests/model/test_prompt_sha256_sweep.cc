// The per-unit prompt hash on a real sweep (SmolLM2, its own ChatML template): the same sweep
// run twice stores the same prompt_sha256 for every unit; within a run the units of one prompt
// (policies full and h2o) share it; wrapping the prompt in the chat template (chat: true) changes
// it; and the chat prompt is the one the hand-written ChatML oracle renders (SmolLM2's prompts
// stay bit-identical to kvbench's before the Jinja engine).
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "run_kvbench.h"
#include "workers/model_session.h"

namespace kvb {
namespace {

const std::string kModel = std::string(KVB_MODELS_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";

std::string fresh_dir() {
  const std::string d = std::string(KVB_BINARY_DIR) + "/test_prompt_sha256_sweep/" +
                        ::testing::UnitTest::GetInstance()->current_test_info()->name() + "_" +
                        std::to_string(getpid());
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

struct Row {
  std::string options, sample, policy, hash;
  int prompt_tokens = 0;
};

std::vector<Row> rows(const std::string& db) {
  sqlite3* h = nullptr;
  EXPECT_EQ(sqlite3_open_v2(db.c_str(), &h, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK) << db;
  sqlite3_stmt* st = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(h,
                               "SELECT u.task_options, u.sample_id, u.policy, m.prompt_sha256, "
                               "m.prompt_tokens FROM units u JOIN measurements m USING (unit_key) "
                               "ORDER BY 1, 2, 3",
                               -1, &st, nullptr),
            SQLITE_OK);
  std::vector<Row> out;
  while (sqlite3_step(st) == SQLITE_ROW) {
    auto text = [&](int c) {
      const auto* t = sqlite3_column_text(st, c);
      return t ? std::string(reinterpret_cast<const char*>(t)) : std::string("NULL");
    };
    out.push_back({text(0), text(1), text(2), text(3), sqlite3_column_int(st, 4)});
  }
  sqlite3_finalize(st);
  sqlite3_close(h);
  return out;
}

TEST(PromptSha256Sweep, SameSweepSameHashesAndChatChangesThem) {
  if (!std::filesystem::exists(kModel)) GTEST_SKIP() << "run scripts/fetch_models.sh: " << kModel;
  const std::string dir = fresh_dir();
  const std::string cfg = dir + "/sweep.yaml";
  std::ofstream(cfg) << "models:\n  - name: smollm2\n    path: " << kModel << "\n"
                     << "tasks:\n"
                     << "  - name: niah\n    options: {context_lengths: [96], depths: [0, 100], "
                        "haystack: noise, chat: true}\n"
                     << "  - name: niah\n    options: {context_lengths: [96], depths: [0, 100], "
                        "haystack: noise, chat: false}\n"
                     << "policies: [full, h2o]\nkv_budget: [48]\nseed: [0]\n";
  std::string err;
  ASSERT_EQ(
      testing::kvbench({"sweep", cfg, "--db", dir + "/a.db", "--threads", "1"}, nullptr, &err), 0)
      << err;
  ASSERT_EQ(
      testing::kvbench({"sweep", cfg, "--db", dir + "/b.db", "--threads", "1"}, nullptr, &err), 0)
      << err;
  const std::vector<Row> a = rows(dir + "/a.db"), b = rows(dir + "/b.db");
  ASSERT_EQ(a.size(), 8u);  // 2 tasks x 2 samples x 2 policies
  ASSERT_EQ(a.size(), b.size());
  std::map<std::pair<bool, std::string>, std::set<std::string>> by_prompt;  // (chat, sample)
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].options + a[i].sample + a[i].policy, b[i].options + b[i].sample + b[i].policy);
    EXPECT_EQ(a[i].hash.size(), 64u) << a[i].hash;
    EXPECT_EQ(a[i].hash, b[i].hash) << a[i].sample << " " << a[i].policy;
    const bool chat = a[i].options.find("\"chat\":\"true\"") != std::string::npos;
    by_prompt[{chat, a[i].sample}].insert(a[i].hash);
  }
  ASSERT_EQ(by_prompt.size(), 4u);
  for (const auto& [k, hashes] : by_prompt) EXPECT_EQ(hashes.size(), 1u) << k.second;  // policies
  auto hash = [&](bool chat, const std::string& s) {
    const auto it = by_prompt.find(std::make_pair(chat, s));
    return it == by_prompt.end() ? std::string("missing ") + s : *it->second.begin();
  };
  for (const std::string s : {"len96_depth0_s0", "len96_depth100_s0"}) {
    EXPECT_NE(hash(true, s), hash(false, s)) << s;
  }
  EXPECT_NE(hash(true, "len96_depth0_s0"), hash(true, "len96_depth100_s0"));
}

// The chat prompt kvbench now renders through SmolLM2's own template equals the hand-written
// ChatML oracle's (with the template's default system message), token for token, and its BOS
// handling is unchanged (SmolLM2 sets add_bos_token false; its BOS text <|im_start|> starts
// every chat prompt, which the template writes itself).
TEST(PromptSha256Sweep, SmolLM2ChatPromptEqualsChatMLOracle) {
  if (!std::filesystem::exists(kModel)) GTEST_SKIP() << "run scripts/fetch_models.sh: " << kModel;
  const workers::LoadedModel lm = workers::load_tokenizer_only(kModel, "");
  ASSERT_NE(lm.chat, nullptr) << lm.chat_error;
  for (const std::string system : {"", "You are terse."}) {
    const std::string user = "Where is the needle? <|im_end|> stays text";
    const std::vector<int32_t> got = workers::encode_prompt(lm, user, true, system);
    std::vector<tokenizer::ChatMessage> m;
    if (!system.empty()) m.push_back({"system", system});
    m.push_back({"user", "\x01"});
    const std::string oracle = tokenizer::apply_chat_template(
        tokenizer::ChatFormat::kChatML, m, true, tokenizer::chat_default_system(lm.chat_template));
    const size_t at = oracle.find('\x01');
    std::vector<int32_t> want = workers::encode_text(lm, oracle.substr(0, at), true, false);
    for (int32_t id : workers::encode_text(lm, user, false, false)) want.push_back(id);
    for (int32_t id : workers::encode_text(lm, oracle.substr(at + 1), true, false))
      want.push_back(id);
    EXPECT_EQ(got, want) << "system '" << system << "'";
  }
  EXPECT_FALSE(workers::prompt_needs_bos(lm, true));
}

}  // namespace
}  // namespace kvb
