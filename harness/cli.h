// The kvbench subcommand table: one file per subcommand (cmd_<name>.cc) defines its run function.
// Each receives the arguments after the subcommand name and returns the process exit code
// (0 ok, 1 a unit or check failed, 2 usage or configuration error).
#pragma once

#include <boost/program_options.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "workers/engine/engine_types.h"

namespace kvb::harness {

struct Subcommand {
  const char* name;
  const char* summary;
  int (*run)(const std::vector<std::string>& args);
};

// The registered subcommands, in the order `kvbench --help` lists them.
const std::vector<Subcommand>& subcommands();

// Entry point shared by main() and tests: parses argv, dispatches, maps errors to exit codes.
int run_cli(int argc, char** argv);

// Parses a subcommand's options (and common_options()) into vm; returns false (after printing
// the help to stdout) when --help was given. Parse errors are usage errors naming the
// subcommand's --help.
bool parse_command_line(const std::vector<std::string>& args,
                        const boost::program_options::options_description& desc,
                        const boost::program_options::positional_options_description* positional,
                        const char* command, boost::program_options::variables_map* vm);

// The options every command takes: -v / --verbose (the debug log: an error's source location,
// Error::origin). apply_common_options sets the log level from them.
boost::program_options::options_description common_options();
void apply_common_options(const boost::program_options::variables_map& vm);

// `--threads` of the one-process commands: 0 (all cores) up to kMaxThreads, else a usage error
// (100000 threads crashed the OpenMP runtime); sets the OpenMP thread count when positive.
constexpr int kMaxThreads = 1024;
void set_threads_option(int threads);
// `--seed` as given: decimal digits only (boost reads "-1" into an unsigned as 2^64 - 1).
uint64_t parse_seed_option(const std::string& text);

// `--device` and `--dtype` of the one-process commands (generate, eval).
struct DeviceOptions {
  std::string device = "cpu", dtype;
};
void add_device_options(boost::program_options::options_description& desc, DeviceOptions* o);
struct DeviceChoice {
  engine::Device device;
  engine::DType dtype;
};
// Parses and resolves the options; with cuda, fails ("this build has no CUDA", "no GPU
// visible") before anything slow such as a model load.
DeviceChoice resolve_device_options(const DeviceOptions& o);

int cmd_generate(const std::vector<std::string>& args);
int cmd_ls(const std::vector<std::string>& args);
int cmd_inspect(const std::vector<std::string>& args);
int cmd_eval(const std::vector<std::string>& args);
int cmd_sweep(const std::vector<std::string>& args);
int cmd_query(const std::vector<std::string>& args);
int cmd_show(const std::vector<std::string>& args);
int cmd_report(const std::vector<std::string>& args);
int cmd_validate(const std::vector<std::string>& args);

}  // namespace kvb::harness
