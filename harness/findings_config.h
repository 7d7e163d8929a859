// A sweep config's `findings:` (configs/README.md "Findings"): the paper's claims, read into
// results::Findings and checked against the config's own matrix (tasks, policies with their
// options, budgets) so that a typo fails before a long sweep, not in its verdicts.
#pragma once

#include <string>
#include <vector>

#include "harness/sweep_config.h"
#include "results/findings.h"
#include "results/store.h"

namespace kvb::harness {

namespace yamlcfg {
struct Node;
}

// Reads `findings:` (keys, types, ids, expectations, margins, budgets). Usage errors name the
// file, line and key.
results::Findings parse_findings(const yamlcfg::Node& n);
// Every claim names a task of the config, a policy entry whose options hold the claim's, and a
// budget of the config (none for full); every baseline names a task of the config.
void check_findings(const results::Findings& f, const SweepConfig& cfg, const yamlcfg::Node& at);
// The findings of the newest run in the database whose stored config has `findings:`; empty when
// none does. A stored config that no longer parses is skipped.
std::vector<results::Findings> findings_of_db(const results::Store& store);

}  // namespace kvb::harness
