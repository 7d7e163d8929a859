// Hostile model and tokenizer files (issue 31, "Nothing is dropped silently"): a FIFO or a device
// given as a model or tokenizer file is refused without blocking in open() (symbolic links to
// regular files still load); tokenizer files are bounded before they are read; NaN or infinite
// token scores and special-token ids that name no token (-1, past the vocabulary, wrong-typed) are
// refused naming the file and the key or token. Files live in a per-process folder.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <iostream>
#include <limits>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/error.h"
#include "harness/cli.h"
#include "harness/model_info.h"
#include "harness/sweep_config.h"
#include "tasks/haystack.h"
#include "tasks/jsonl.h"
#include "tokenizer_gguf_writer.h"
#include "workers/engine/model.h"
#include "kernels/formats/file_io.h"
#include "workers/formats/gguf.h"
#include "workers/formats/model_load.h"
#include "workers/model_session.h"
#include "workers/tokenizer/tokenizer.h"

namespace kvb {
namespace {
namespace fs = std::filesystem;

const std::string kModel = KVB_SHARED_DIR "/models/stories260K/stories260K.bin";
const std::string kTok = KVB_SHARED_DIR "/models/stories260K/tok512.bin";

std::string scratch() {
  const std::string d = std::string(KVB_BINARY_DIR) + "/test_loader_hostile_" +
                        std::to_string(::getpid()) + "_" +
                        ::testing::UnitTest::GetInstance()->current_test_info()->name();
  fs::create_directories(d);
  return d;
}

// The message of f()'s kvb::Error of the given kind ("" and a failure otherwise).
std::string error_of(const std::function<void()>& f, ErrorKind kind) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no kvb::Error thrown";
  return "";
}

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

// A FIFO without a writer blocks open(2) for reading forever: every reader of a model or
// tokenizer file must refuse it before opening it that way. SIGALRM ends the test process if one
// still blocks, instead of hanging the suite until ctest's limit.
TEST(LoaderHostile, FifoModelOrTokenizerIsRefusedWithoutBlocking) {
  const std::string fifo = scratch() + "/model.gguf";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  ::alarm(60);
  const std::string as_model = "model file '" + fifo +
                               "' is a FIFO (named pipe), not a regular file; give the file "
                               "itself (a symbolic link to one is fine)";
  EXPECT_HAS(error_of([&] { engine::load_model(fifo); }, ErrorKind::kUsage), as_model);
  EXPECT_HAS(error_of([&] { workers::load_model_and_tokenizer(fifo, ""); }, ErrorKind::kUsage),
             as_model);
  EXPECT_HAS(error_of([&] { workers::load_tokenizer_only(fifo, ""); }, ErrorKind::kUsage),
             as_model);
  EXPECT_HAS(error_of([&] { formats::GgufFile::open(fifo); }, ErrorKind::kUsage),
             fifo + ": not a regular file (expected a GGUF file); it is a FIFO (named pipe)");
  EXPECT_HAS(error_of([&] { harness::read_model_info(fifo); }, ErrorKind::kUsage),
             "model file '" + fifo + "' does not exist or is not a file");
  EXPECT_HAS(error_of([&] { tokenizer::load_llama2c_tokenizer(fifo, 512); }, ErrorKind::kUsage),
             "llama2.c tokenizer '" + fifo + "' is a FIFO (named pipe), not a regular file");
  EXPECT_HAS(error_of([&] { tokenizer::load_hf_tokenizer_json(fifo); }, ErrorKind::kUsage),
             "tokenizer.json '" + fifo + "' is a FIFO (named pipe), not a regular file");
  if (fs::exists(kModel)) {
    EXPECT_HAS(
        error_of([&] { workers::load_model_and_tokenizer(kModel, fifo); }, ErrorKind::kUsage),
        "llama2.c tokenizer '" + fifo + "' is a FIFO (named pipe)");
  }
  // A device never ends: /dev/zero as a tokenizer would be read until memory runs out.
  EXPECT_HAS(error_of([&] { tokenizer::load_llama2c_tokenizer("/dev/zero", 512); },
                      ErrorKind::kUsage),
             "llama2.c tokenizer '/dev/zero' is a character device, not a regular file");
  EXPECT_HAS(error_of([&] { engine::load_model("/dev/zero"); }, ErrorKind::kUsage),
             "model file '/dev/zero' is a character device");
  ::alarm(0);
  fs::remove_all(fs::path(fifo).parent_path());
}

// Runs `read` on a thread of its own and returns the message of the usage error it throws (a
// failure naming what came instead otherwise), with the seconds it took. A reader that blocks (a
// FIFO's open waits for a writer) or reads without end (/dev/zero) fails the test after 30 s and
// ends the process: its thread cannot be stopped, and the suite must not hang until ctest's limit.
std::string usage_error_in_time(const std::string& what, const std::function<void()>& read,
                                double* seconds) {
  auto result = std::make_shared<std::promise<std::string>>();
  std::future<std::string> message = result->get_future();
  const auto t0 = std::chrono::steady_clock::now();
  std::thread([read, result] {
    try {
      read();
      result->set_value("(no error thrown)");
    } catch (const Error& e) {
      result->set_value(e.kind() == ErrorKind::kUsage ? e.what()
                                                      : std::string("(not a usage error) ") +
                                                            e.what());
    } catch (const std::exception& e) {
      result->set_value(std::string("(not a kvb::Error) ") + e.what());
    }
  }).detach();
  if (message.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
    std::cerr << "FAILED: " << what << " still reads after 30 s (blocked on a FIFO, or reading a "
              << "device without end); ending the test process" << std::endl;
    std::_Exit(1);
  }
  *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return message.get();
}

// Issue 31 for the files a config names beside its models: a YAML config (and its includes),
// `kvbench generate --prompt-file`, a niah haystack file and a task's data file that is a FIFO or
// a device is refused before it is opened, naming the path and what it is, at once.
TEST(LoaderHostile, FifoOrDeviceAsConfigPromptOrHaystackIsRefusedWithoutBlocking) {
  const std::string d = scratch();
  const std::string fifo = d + "/input.yaml";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  const std::string includes_fifo = d + "/includes_fifo.yaml";
  std::ofstream(includes_fifo) << "include: input.yaml\n";
  struct Reader {
    std::string what;
    std::function<void(const std::string& path)> read;
    std::string names;  // how the message names the input, before " '<path>' is ..."
  };
  const std::vector<Reader> readers = {
      {"config", [](const std::string& p) { harness::load_sweep_config(p); }, "config file"},
      {"--prompt-file",
       [](const std::string& p) {
         harness::cmd_generate({"--model", "unused.gguf", "--prompt-file", p});
       },
       "--prompt-file"},
      {"haystack_file",
       [](const std::string& p) { tasks::haystack_text(tasks::HaystackSource{"file", "", p}); },
       "haystack_file"},
      {"data file", [](const std::string& p) { tasks::read_jsonl(p, {}); }, "data file"},
      {"text corpus",
       [](const std::string& p) { tasks::read_text_file(p, "file", "", size_t{1} << 20); },
       "data file"},
  };
  for (const Reader& r : readers) {
    for (const auto& [path, kind] : std::vector<std::pair<std::string, std::string>>{
             {fifo, "a FIFO (named pipe)"}, {"/dev/zero", "a character device"}}) {
      // Task data files may be pipes (a shell's <(zcat data.gz)): TaskFiles tests the FIFO.
      if (r.names == "data file" && path == fifo) continue;
      double seconds = 0;
      const std::string msg = usage_error_in_time(r.what + " " + path, [&] { r.read(path); },
                                                  &seconds);
      EXPECT_HAS(msg, r.names + " '" + path + "' is " + kind + ", not a regular file");
      EXPECT_LT(seconds, 5.0) << r.what << " " << path;
    }
  }
  // An include names the file it cannot read, at the line of the include.
  double seconds = 0;
  const std::string msg = usage_error_in_time(
      "include", [&] { harness::load_sweep_config(includes_fifo); }, &seconds);
  EXPECT_HAS(msg, "includes_fifo.yaml:1: include: '" + fifo +
                      "' is a FIFO (named pipe), not a regular file; give a YAML file");
  fs::remove_all(d);
}

// Symbolic links to regular files keep working (the check follows them), and so does a FIFO's
// neighbour: only the file itself is refused.
TEST(LoaderHostile, SymlinksToRegularFilesStillLoad) {
  if (!fs::exists(kModel)) GTEST_SKIP() << "stories260K not found under " KVB_SHARED_DIR;
  const std::string d = scratch();
  fs::create_symlink(kModel, d + "/model.bin");
  fs::create_symlink(kTok, d + "/tok.bin");
  fs::create_symlink(d + "/tok.bin", d + "/tok_link_to_link.bin");
  const workers::LoadedModel lm =
      workers::load_model_and_tokenizer(d + "/model.bin", d + "/tok_link_to_link.bin");
  EXPECT_EQ(lm.tokenizer->vocab_size(), 512);
  EXPECT_EQ(harness::read_model_info(d + "/model.bin").vocab_size, 512);
  EXPECT_EQ(formats::regular_file_size(d + "/tok.bin", "tokenizer"), fs::file_size(kTok));
  formats::Fd fd;
  EXPECT_EQ(formats::open_regular(d + "/model.bin", "model", &fd), fs::file_size(kModel));
  fs::remove_all(d);
}

// Self-referencing paths: a symbolic link to itself is refused by the open, naming the path.
TEST(LoaderHostile, SymlinkLoopsAreRefused) {
  const std::string d = scratch();
  const std::string loop = d + "/loop.gguf";
  fs::create_symlink(loop, loop);
  EXPECT_HAS(error_of([&] { engine::load_model(loop); }, ErrorKind::kUsage),
             "cannot open model file '" + loop + "': Too many levels of symbolic links");
  EXPECT_HAS(error_of([&] { harness::read_model_info(loop); }, ErrorKind::kUsage),
             "model file '" + loop + "' does not exist or is not a file");
  EXPECT_HAS(error_of([&] { formats::GgufFile::open(loop); }, ErrorKind::kUsage),
             "cannot open GGUF file '" + loop + "': Too many levels of symbolic links");
  EXPECT_HAS(error_of([&] { tokenizer::load_llama2c_tokenizer(loop, 512); }, ErrorKind::kRuntime),
             "cannot open llama2.c tokenizer " + loop);
  fs::remove_all(d);
}

// A tokenizer file is read whole: one above 256 MiB (here sparse, 300 MiB) is refused by its size
// before a byte is read, as a model file given as the tokenizer would be.
TEST(LoaderHostile, HugeTokenizerFilesAreRefusedBeforeReading) {
  const std::string d = scratch();
  for (const std::string name : {"tokenizer.json", "tokenizer.bin"}) {
    const std::string path = d + "/" + name;
    std::ofstream(path, std::ios::binary) << "{";
    fs::resize_file(path, uint64_t{300} << 20);
    const std::string e =
        error_of([&] { name == "tokenizer.json" ? (void)tokenizer::load_hf_tokenizer_json(path)
                                                : (void)tokenizer::load_llama2c_tokenizer(path, 512); },
                 ErrorKind::kUsage);
    EXPECT_HAS(e, path + ": 314572800 bytes; a " +
                      std::string(name == "tokenizer.json" ? "tokenizer.json" : "llama2.c tokenizer.bin") +
                      " above 256 MiB is not plausible (is it the model file?)");
  }
  fs::remove_all(d);
}

// llama2.c tokenizer.bin: int32 max_token_length, then per token f32 score, int32 length, bytes.
std::string write_llama2c_tokenizer(const std::string& path, const std::vector<float>& scores) {
  std::string b;
  auto put = [&](const void* p, size_t n) { b.append(static_cast<const char*>(p), n); };
  const int32_t max_len = 8;
  put(&max_len, 4);
  for (size_t i = 0; i < scores.size(); ++i) {
    const std::string piece = i == 0 ? "<unk>" : i == 1 ? "<s>" : i == 2 ? "</s>" : "t" + std::to_string(i);
    const int32_t len = static_cast<int32_t>(piece.size());
    put(&scores[i], 4);
    put(&len, 4);
    put(piece.data(), piece.size());
  }
  std::ofstream(path, std::ios::binary) << b;
  return path;
}

TEST(LoaderHostile, Llama2cTokenizerScoresMustBeFinite) {
  const std::string d = scratch();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(tokenizer::load_llama2c_tokenizer(
                write_llama2c_tokenizer(d + "/ok.bin", {0, 0, 0, -1.5f, -2}), 5)
                ->vocab_size(),
            5);
  // Offsets: 4 (header), then 8 + 5, 8 + 3, 8 + 4 bytes for tokens 0..2.
  EXPECT_HAS(error_of([&] {
               tokenizer::load_llama2c_tokenizer(
                   write_llama2c_tokenizer(d + "/nan.bin", {0, 0, 0, nan, -2}), 5);
             },
                      ErrorKind::kRuntime),
             d + "/nan.bin: token 3 has score nan at offset 40; expected a finite number");
  EXPECT_HAS(error_of([&] {
               tokenizer::load_llama2c_tokenizer(
                   write_llama2c_tokenizer(d + "/inf.bin", {0, inf, 0, 0, 0}), 5);
             },
                      ErrorKind::kRuntime),
             d + "/inf.bin: token 1 has score inf at offset 17; expected a finite number");
  EXPECT_HAS(error_of([&] {
               tokenizer::load_llama2c_tokenizer(
                   write_llama2c_tokenizer(d + "/ninf.bin", {0, 0, -inf, 0, 0}), 5);
             },
                      ErrorKind::kRuntime),
             "token 2 has score -inf at offset 28");
  // Truncated in the middle of a score.
  const std::string cut = d + "/cut.bin";
  write_llama2c_tokenizer(cut, {0, 0, 0, 0, 0});
  fs::resize_file(cut, 42);
  EXPECT_HAS(error_of([&] { tokenizer::load_llama2c_tokenizer(cut, 5); }, ErrorKind::kRuntime),
             cut + ": truncated llama2.c tokenizer: need the score of token 3 at offset 40");
  fs::remove_all(d);
}

// A GGUF "llama" (SentencePiece) vocabulary of 5 tokens; `edit` adds or replaces keys.
std::string write_spm_gguf(const std::string& path, const std::vector<float>& scores,
                           const std::function<void(testing::GgufMetadataWriter&)>& edit) {
  testing::GgufMetadataWriter w;
  w.add_string("tokenizer.ggml.model", "llama");
  w.add_string_array("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "\xE2\x96\x81" "a", "b"});
  w.add_f32_array("tokenizer.ggml.scores", scores);
  if (edit) edit(w);
  EXPECT_TRUE(w.write(path));
  return path;
}

std::string gguf_tokenizer_error(const std::string& path, ErrorKind kind = ErrorKind::kRuntime) {
  return error_of([&] { tokenizer::load_gguf_tokenizer(*formats::GgufFile::open(path)); }, kind);
}

TEST(LoaderHostile, GgufTokenScoresMustBeFinite) {
  const std::string d = scratch();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const auto ok = write_spm_gguf(d + "/ok.gguf", {0, 0, 0, -1, -2}, nullptr);
  EXPECT_EQ(tokenizer::load_gguf_tokenizer(*formats::GgufFile::open(ok))->vocab_size(), 5);
  EXPECT_HAS(gguf_tokenizer_error(write_spm_gguf(d + "/nan.gguf", {0, 0, 0, nan, -2}, nullptr)),
             d + "/nan.gguf: metadata key 'tokenizer.ggml.scores'[3] = nan is not a finite number");
  EXPECT_HAS(gguf_tokenizer_error(write_spm_gguf(d + "/inf.gguf", {0, inf, 0, -1, -2}, nullptr)),
             "metadata key 'tokenizer.ggml.scores'[1] = inf is not a finite number");
  EXPECT_HAS(gguf_tokenizer_error(write_spm_gguf(d + "/ninf.gguf", {0, 0, -inf, -1, -2}, nullptr)),
             "metadata key 'tokenizer.ggml.scores'[2] = -inf is not a finite number");
  fs::remove_all(d);
}

// Special-token ids: absent keys take llama.cpp's defaults; a present key must name a token.
// -1 (LLAMA_TOKEN_NULL) is no id a GGUF can hold (they are u32): read as "none", it would drop
// the end-of-generation token silently.
TEST(LoaderHostile, GgufSpecialTokenIdsMustNameATokenWhenPresent) {
  const std::string d = scratch();
  const std::vector<float> scores = {0, 0, 0, -1, -2};
  const auto lone = [&](const std::string& name, auto add) {
    return write_spm_gguf(d + "/" + name + ".gguf", scores, add);
  };
  EXPECT_HAS(gguf_tokenizer_error(lone("eos_minus_1", [](auto& w) {
               w.add_i32("tokenizer.ggml.eos_token_id", -1);
             })),
             d + "/eos_minus_1.gguf: metadata key 'tokenizer.ggml.eos_token_id' = -1 is not a "
                 "token id (0..4; leave the key out when the vocabulary has no such token)");
  EXPECT_HAS(gguf_tokenizer_error(lone("eot_minus_1", [](auto& w) {
               w.add_i32("tokenizer.ggml.eot_token_id", -1);
             })),
             "metadata key 'tokenizer.ggml.eot_token_id' = -1 is not a token id (0..4");
  EXPECT_HAS(gguf_tokenizer_error(lone("bos_past_end", [](auto& w) {
               w.add_u32("tokenizer.ggml.bos_token_id", 5);
             })),
             "metadata key 'tokenizer.ggml.bos_token_id' = 5 is not a token id (0..4");
  EXPECT_HAS(gguf_tokenizer_error(lone("unk_u32_max", [](auto& w) {
               w.add_u32("tokenizer.ggml.unknown_token_id", 0xFFFFFFFFu);
             })),
             "metadata key 'tokenizer.ggml.unknown_token_id' = 4294967295 is not a token id");
  EXPECT_HAS(gguf_tokenizer_error(lone("eos_string", [](auto& w) {
               w.add_string("tokenizer.ggml.eos_token_id", "2");
             })),
             "metadata key 'tokenizer.ggml.eos_token_id'");
  // Present and in range: used; absent: the defaults <unk> 0, <s> 1, </s> 2.
  const auto t = tokenizer::load_gguf_tokenizer(*formats::GgufFile::open(
      lone("eos_4", [](auto& w) { w.add_u32("tokenizer.ggml.eos_token_id", 4); })));
  EXPECT_EQ(t->eos_id(), 4);
  EXPECT_EQ(t->bos_id(), 1);
  fs::remove_all(d);
}

}  // namespace
}  // namespace kvb
