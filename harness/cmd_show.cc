// `kvbench show --config FILE.yaml --db FILE UNIT_KEY`: the prompt a unit fed the model,
// regenerated from its content-keyed inputs (issue 34 "Prompts you can see"). The config's matrix
// is expanded as the sweep expands it (into a scratch database: the results database is only
// read); the unit must be one of it with its key as stored, which holds the sample's content
// (results/store.h), so inputs that changed since the unit ran are refused rather than shown. The
// prompt is built as the worker builds it (workers/unit_run.h build_prompt: chat template, BOS,
// middle truncation) and its token ids' SHA-256 is checked against the unit's prompt_sha256.
#include <unistd.h>

#include <boost/program_options.hpp>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "common/error.h"
#include "common/escape.h"
#include "harness/cli.h"
#include "harness/model_info.h"
#include "harness/sweep_config.h"
#include "harness/sweep_plan.h"
#include "results/sqlite_util.h"
#include "results/store.h"
#include "workers/model_session.h"
#include "workers/runner.h"

namespace po = boost::program_options;

namespace kvb::harness {

namespace {

// Text for a terminal: valid UTF-8, and every control character but newline and tab (C0, DEL and
// C1: an ESC sequence from a dataset must not drive the terminal) as a visible \xNN escape.
std::string terminal_text(const std::string& raw) {
  const std::string s = sanitize_utf8(raw);
  std::string out;
  out.reserve(s.size());
  char buf[8];
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const bool c1 = c == 0xc2 && i + 1 < s.size() && static_cast<unsigned char>(s[i + 1]) >= 0x80 &&
                    static_cast<unsigned char>(s[i + 1]) <= 0x9f;
    if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7f) {
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else if (c1) {
      std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned char>(s[++i]));
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

// The stored unit whose key is `key` or starts with it (at least 8 hex digits, unique).
std::string resolve_key(const results::Store& store, const std::string& key) {
  KVB_USAGE_CHECK(key.size() >= 8 && key.size() <= 64 &&
                  key.find_first_not_of("0123456789abcdef") == std::string::npos)
      << "unit key '" << key
      << "' is not a key: give the unit_key (64 lowercase hex digits, or its first 8 or more), "
         "e.g. from `kvbench query --db FILE \"SELECT unit_key, task, sample_id, policy FROM "
         "units\"`";
  const results::QueryResult r =
      store.query("SELECT unit_key FROM units WHERE substr(unit_key, 1, ?2) = ?1 LIMIT 2",
                  {key, std::to_string(key.size())});
  KVB_USAGE_CHECK(!r.rows.empty()) << "no unit " << key << " in " << store.path();
  KVB_USAGE_CHECK(r.rows.size() == 1) << "unit key prefix " << key << " is ambiguous in "
                                      << store.path() << "; give more digits";
  return r.rows[0][0].text;
}

}  // namespace

int cmd_show(const std::vector<std::string>& args) {
  std::string db, config, key;
  po::options_description desc(
      "usage: kvbench show --config FILE.yaml --db FILE UNIT_KEY\n\n"
      "Prints the prompt a unit fed the model: the config's matrix is expanded as `kvbench sweep`\n"
      "expands it (its files read as they are now; the database is only read), the unit is found\n"
      "by its key, which holds its sample's content, and the prompt is rebuilt as the worker\n"
      "builds it (chat template, BOS, truncation). Its token ids' SHA-256 is checked against the\n"
      "unit's stored prompt_sha256. Refused when the unit is not one of the config's units as\n"
      "its files are now (its data or definition changed since it ran). Control characters of\n"
      "the text are shown escaped (\\xNN).\n\n"
      "options");
  desc.add_options()("help,h", "print this help")
      ("config", po::value(&config), "the sweep config the unit ran from")
      ("db", po::value(&db), "the results database")
      ("unit", po::value(&key), "the unit key, or its first 8+ hex digits (positional)");
  po::positional_options_description pos;
  pos.add("unit", 1);
  po::variables_map vm;
  if (!parse_command_line(args, desc, &pos, "show", &vm)) return 0;
  KVB_USAGE_CHECK(!db.empty()) << "--db FILE is required (see kvbench show --help)";
  KVB_USAGE_CHECK(!config.empty()) << "--config FILE.yaml is required: the sweep config the "
                                      "unit ran from (see kvbench show --help)";
  KVB_USAGE_CHECK(!key.empty()) << "give a unit key (see kvbench show --help)";

  const results::Store store = results::Store::open(db, results::Mode::kReadOnly);
  key = resolve_key(store, key);
  const results::QueryResult row = store.query(
      "SELECT u.model, u.task, u.sample_id, u.policy, u.kv_budget_spec, u.status, "
      "u.sample_sha256, m.prompt_sha256, m.prompt_tokens FROM units u LEFT JOIN measurements m "
      "USING (unit_key) WHERE u.unit_key = ?1",
      {key});
  const auto& r = row.rows.at(0);
  KVB_USAGE_CHECK(r[6].kind != results::QueryValue::kNull)
      << "unit " << key << " was keyed by an older kvbench (by file paths, not content): run "
      << "`kvbench sweep " << config << " --db " << db
      << "` once (it adopts such units under content keys), then show it";

  // The matrix as the sweep expands it, registered in a scratch database that takes the results
  // database's model digests (so that a model is not hashed again).
  const std::string scratch = (std::filesystem::temp_directory_path() /
                               ("kvbench_show_" + std::to_string(::getpid()) + ".db"))
                                  .string();
  struct Remove {
    std::string path;
    ~Remove() {
      for (const char* ext : {"", "-wal", "-shm"}) std::filesystem::remove(path + ext);
    }
  } remove{scratch};
  const SweepConfig cfg = load_sweep_config(config);
  Plan plan;
  {
    results::Store tmp = results::Store::open(scratch, results::Mode::kReadWrite);
    for (const auto& d :
         store.query("SELECT path, size, mtime_ns, inode, sha256 FROM file_digests").rows) {
      tmp.remember_digest({d[0].text, std::stoll(d[1].text), std::stoll(d[2].text),
                           std::stoll(d[3].text)},
                          d[4].text);
    }
    std::map<std::string, std::string> hashes;
    plan = expand(cfg, tmp, tmp.begin_run(results::RunInfo{}), &hashes);
  }
  const WireBundle* bundle = nullptr;
  const WireUnit* unit = nullptr;
  for (const WireBundle& b : plan.bundles) {
    for (const WireUnit& u : b.units) {
      if (u.key == key) {
        bundle = &b;
        unit = &u;
      }
    }
  }
  KVB_USAGE_CHECK(bundle) << "unit " << key << " (" << r[1].text << " sample " << r[2].text
                          << ", policy " << r[3].text << ") is not a unit of " << config
                          << " as its files are now: its sample's data or the task's definition "
                             "changed since it ran, or it ran from another config. Its prompt "
                             "cannot be rebuilt from these inputs";
  const ModelEntry& me = cfg.models.at(bundle->model);
  const workers::LoadedModel lm = workers::load_tokenizer_only(me.path, me.tokenizer);
  const int ctx_limit = read_model_info(me.path).max_seq_len;
  const tasks::Sample& s = bundle->sample;
  workers::RunSettings rs;
  rs.max_prompt_tokens = cfg.max_prompt_tokens;
  int truncated = 0;
  const std::vector<int32_t> ids = workers::unit_prompt_tokens(lm, s, rs, ctx_limit, &truncated);
  const std::string sha = workers::token_ids_sha256({&ids});
  const bool measured = r[7].kind != results::QueryValue::kNull;
  std::cout << "# unit " << key << "\n# model " << me.name << ", task " << r[1].text << ", sample "
            << terminal_text(r[2].text) << ", policy " << r[3].text << ", kv_budget "
            << (r[4].text.empty() ? "-" : r[4].text) << ", question " << unit->question
            << ", status " << r[5].text << "\n# prompt: " << ids.size() << " tokens"
            << (truncated > 0 ? " (" + std::to_string(truncated) + " cut by truncation)" : "")
            << ", SHA-256 " << sha << "\n";
  if (!measured) {
    std::cout << "# not checked: the unit has no stored prompt_sha256 (not run yet, failed "
                 "before its prompt, or run by a kvbench before schema 6)\n";
  } else {
    KVB_CHECK(r[7].text == sha)
        << "unit " << key << ": the rebuilt prompt's SHA-256 " << sha << " (" << ids.size()
        << " tokens) differs from the stored prompt_sha256 " << r[7].text << " (" << r[8].text
        << " tokens): the model's tokenizer or chat template, or kvbench's prompt assembly, "
           "changed since the unit ran";
    std::cout << "# equals the stored prompt_sha256: this is the prompt the unit ran\n";
  }
  if (s.kind == tasks::SampleKind::kChoice) {
    std::cout << "# then each of " << s.choices.size() << " choices is scored after it\n";
  }
  std::cout << "\n" << terminal_text(lm.tokenizer->decode(ids, false)) << "\n";
  return 0;
}

}  // namespace kvb::harness
