// The output folder of `kvbench report` (results/report.h), written so that a hostile or careless
// --out cannot cost the user files: only files the report itself wrote before (listed in the
// folder's manifest, `.kvbench-report`) are ever deleted; index.html and report.md are replaced
// only when they carry the report's marker (kHtmlMarker, kMarkdownMarker: a user's own page in
// --out is refused, never overwritten); csv/, plots/ and latex/ must be real folders,
// not symbolic links; every file is written to a fresh temporary name and renamed over the
// target, so a symbolic link at a target's name is replaced, never followed.
#pragma once

#include <set>
#include <string>

namespace kvb::results {

class ReportDir {
 public:
  static constexpr const char* kManifest = ".kvbench-report";
  // What marks index.html and report.md as the report's own, near their start.
  static constexpr const char* kHtmlMarker = "<meta name=\"generator\" content=\"kvbench report\">";
  static constexpr const char* kMarkdownMarker = "<!-- generator: kvbench report -->";

  // Creates DIR, DIR/csv, DIR/plots and DIR/latex as needed; usage errors for a symbolic link at csv/,
  // plots/ or the manifest, a file at index.html or report.md without the report's marker (a
  // symbolic link there is replaced, its target untouched), or a folder that cannot be created.
  // Reads the previous manifest.
  explicit ReportDir(const std::string& dir);

  // Writes `text` to DIR/`rel` ("index.html", "csv/summary.csv"); throws kvb::Error on failure.
  void write(const std::string& rel, const std::string& text);

  // Deletes what the previous report listed and this one did not write (a regular file under
  // csv/ or plots/ with the report's own extension, nothing else), then writes the manifest.
  void finish();

 private:
  std::string dir_;
  std::set<std::string> previous_, written_;
};

}  // namespace kvb::results
