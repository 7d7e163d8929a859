// kvbench's top-level dispatch: `kvbench <command> [options]`, with errors mapped to exit codes.
#include "harness/cli.h"

#include <omp.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "common/error.h"
#include "common/log.h"
#include "harness/git_rev.h"
#include "kernels/cpu/isa.h"

namespace kvb::harness {

const std::vector<Subcommand>& subcommands() {
  static const std::vector<Subcommand> table = {
      {"generate", "generate text from a prompt with a model and an eviction policy", cmd_generate},
      {"eval", "run one task end to end under one policy and budget; print scores", cmd_eval},
      {"sweep", "run a YAML experiment matrix (under mpirun or alone) into a SQLite database",
       cmd_sweep},
      {"query", "named queries or SQL over a results database (read-only): tables", cmd_query},
      {"show", "the prompt a unit fed the model, rebuilt from its inputs and checked by hash",
       cmd_show},
      {"report", "HTML + Markdown report: SVG plots, CSV tables, from a results database",
       cmd_report},
      {"ls", "list registered names: kvbench ls policies | tasks", cmd_ls},
      {"inspect", "what kvbench will run of a model file: layers, context, chat template, KV bytes",
       cmd_inspect},
      {"validate", "check a sweep config against the registries; count units; no model loaded",
       cmd_validate},
  };
  return table;
}

namespace {
void print_usage(std::ostream& os) {
  os << "usage: kvbench <command> [options]\n\n"
        "kvbench measures what KV-cache eviction costs and saves in LLM inference.\n\n"
        "commands:\n";
  for (const auto& s : subcommands()) {
    std::string name = s.name;
    name.resize(12, ' ');
    os << "  " << name << s.summary << "\n";
  }
  os << "\n`kvbench <command> --help` lists a command's options; -v (--verbose), before or after\n"
        "the command, adds the debug log (an error's source location among it).\n"
        "Version " KVB_VERSION " (git "
     << git_rev() << ").\n";
}

bool is_verbose_flag(const std::string& a) { return a == "-v" || a == "--verbose"; }

// Restores the log level when a command returns: tests run many commands in one process, and
// one's -v must not make the next one verbose.
class LogLevelScope {
 public:
  LogLevelScope() : saved_(log_level()) {}
  ~LogLevelScope() { set_log_level(saved_); }

 private:
  LogLevel saved_;
};

// The error as the user reads it, and where it was raised for the debug log (-v).
int report_error(const std::string& cmd, const std::string& what, const std::string& origin,
                 int code) {
  std::cerr << "kvbench " << cmd << ": error: " << what << "\n";
  if (!origin.empty()) {
    KVB_LOG_DEBUG << "kvbench " << cmd << ": the error was raised at " << origin;
  }
  return code;
}
}  // namespace

boost::program_options::options_description common_options() {
  boost::program_options::options_description common("options of every command");
  common.add_options()("verbose,v",
                       "debug log on stderr, with the source location of an error (the same as "
                       "KVB_LOG_LEVEL=3)");
  return common;
}

void apply_common_options(const boost::program_options::variables_map& vm) {
  if (vm.count("verbose")) set_log_level(LogLevel::kDebug);
}

bool parse_command_line(const std::vector<std::string>& args,
                        const boost::program_options::options_description& desc,
                        const boost::program_options::positional_options_description* positional,
                        const char* command, boost::program_options::variables_map* vm) {
  namespace po = boost::program_options;
  po::options_description all;
  all.add(desc).add(common_options());
  try {
    po::command_line_parser parser(args);
    parser.options(all);
    if (positional) parser.positional(*positional);
    const po::parsed_options parsed = parser.run();
    // Without a positional description boost keeps stray words unnamed and store() drops them
    // silently (`--prompt Once upon a time` ran "Once"): refuse them, naming each.
    std::string stray;
    for (const po::option& o : parsed.options) {
      if (o.string_key.empty() && o.position_key >= 0) {
        for (const std::string& v : o.value) stray += (stray.empty() ? "'" : " '") + v + "'";
      }
    }
    KVB_USAGE_CHECK(stray.empty())
        << "unexpected argument(s) " << stray
        << ": every value belongs to an option; quote a value with spaces "
           "(--prompt \"Once upon a time\") (see kvbench "
        << command << " --help)";
    po::store(parsed, *vm);
    po::notify(*vm);
  } catch (const po::error& e) {
    KVB_USAGE_FAIL() << e.what() << " (see kvbench " << command << " --help)";
  }
  apply_common_options(*vm);
  if (vm->count("help")) {
    std::cout << all << "\n";
    return false;
  }
  return true;
}

int run_cli(int argc, char** argv) {
  const LogLevelScope log_scope;
  // `kvbench -v CMD ...`: the flag before the command (after it, each command's parser takes it).
  int first = 1;
  while (first < argc && is_verbose_flag(argv[first])) {
    set_log_level(LogLevel::kDebug);
    ++first;
  }
  if (argc - first < 1) {
    print_usage(std::cerr);
    return 2;
  }
  std::string cmd = argv[first];
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    print_usage(std::cout);
    return 0;
  }
  if (cmd == "--version") {
    std::string isa;
    try {
      isa = kernels::cpu::isa_summary();
    } catch (const Error& e) {  // a bad KVB_ISA
      std::cerr << "kvbench: error: " << e.what() << "\n";
      return 2;
    }
    std::cout << "kvbench " KVB_VERSION " (git " << git_rev() << "), cpu kernels: " << isa << "\n";
    return 0;
  }
  std::vector<std::string> args(argv + first + 1, argv + argc);
  for (const auto& s : subcommands()) {
    if (cmd != s.name) continue;
    try {
      // KVB_ISA (kernels/cpu/isa.h) is read before any work, so a bad value stops every command
      // at once, and a forced path is said where its timings are recorded.
      if (kernels::cpu::isa_forced()) {
        KVB_LOG_INFO << "cpu kernels: " << kernels::cpu::isa_summary()
                     << "; timings are of this path";
      }
      return s.run(args);
    } catch (const Error& e) {
      return report_error(cmd, e.what(), e.origin(), e.kind() == ErrorKind::kUsage ? 2 : 1);
    } catch (const std::exception& e) {
      return report_error(cmd, e.what(), "", 1);
    } catch (...) {
      return report_error(cmd, "an exception that is not a std::exception (it carries no message)", "", 1);
    }
  }
  std::cerr << "kvbench: unknown command '" << cmd << "'. Commands:";
  for (const auto& s : subcommands()) std::cerr << " " << s.name;
  std::cerr << "\n";
  return 2;
}

void set_threads_option(int threads) {
  KVB_USAGE_CHECK(threads >= 0 && threads <= kMaxThreads)
      << "--threads must be in [0, " << kMaxThreads << "] (0: all cores), got " << threads;
  if (threads > 0) omp_set_num_threads(threads);
}

uint64_t parse_seed_option(const std::string& text) {
  const bool digits = !text.empty() && text.size() <= 20 &&
                      text.find_first_not_of("0123456789") == std::string::npos;
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = digits ? std::strtoull(text.c_str(), &end, 10) : 0;
  KVB_USAGE_CHECK(digits && errno != ERANGE)
      << "--seed must be an integer in [0, 18446744073709551615], got '" << text << "'";
  return v;
}

void add_device_options(boost::program_options::options_description& desc, DeviceOptions* o) {
  namespace po = boost::program_options;
  desc.add_options()
      ("device", po::value(&o->device)->default_value("cpu"),
       "cpu (the f32 reference) or cuda (GPU 0 of CUDA_VISIBLE_DEVICES; needs a CUDA build)")
      ("dtype", po::value(&o->dtype)->notifier([](const std::string& s) {
         engine::parse_dtype(s);  // given empty, it would mean the device's default
       }),
       "f32, bf16 or native, f32 accumulation; cuda bf16: weights, GEMM inputs and KV cache (the "
       "default); cpu bf16: the linear layers' weights only (default f32, the reference); cpu "
       "native: a GGUF model's linear layers in the file's own quantized blocks (Q4_0, Q4_1, "
       "Q5_0, Q8_0, Q4_K, Q5_K, Q6_K) with 8-bit activations and an f16 KV cache, llama.cpp's "
       "arithmetic family");
}

DeviceChoice resolve_device_options(const DeviceOptions& o) {
  DeviceChoice c;
  c.device = engine::parse_device(o.device);
  c.dtype = engine::resolve_dtype(c.device, o.dtype);
  if (c.device == engine::Device::kCuda) engine::cuda_device_label(/*require_device=*/true);
  return c;
}

}  // namespace kvb::harness
