// Refusing a path that is not a regular file before it is opened for reading (issue 31, "Nothing
// is dropped silently"): a FIFO without a writer blocks open(2) forever, a device (/dev/zero)
// never ends, a directory reads as an error that names nothing. Every reader of a file the user
// names (configs, task definitions, --prompt-file, haystack files, model and tokenizer files)
// checks it here first, following symbolic links (a link to a regular file is fine).
#pragma once

#include <filesystem>
#include <string>

namespace kvb {

// What the path is when it exists and is not a regular file after following symbolic links:
// "a FIFO (named pipe)", "a directory", "a character device", "a block device", "a socket", "of
// an unknown type"; "" for a regular file and for a path that does not exist or cannot be
// examined (the caller's open then names it, with its own message).
std::string non_regular_file_kind(const std::string& path);
// The same words for a file type (std::filesystem::file_type::regular and not_found: "").
std::string non_regular_file_kind(std::filesystem::file_type type);

// Throws a usage error when the path exists and is not a regular file:
// "<what> '<path>' is a FIFO (named pipe), not a regular file; <fix>". `what` names the input
// ("config file", "--prompt-file", "haystack file"); `fix` says what to give instead. Never opens
// the path, so it never blocks. A missing path is left to the caller's open.
void require_regular_file(const std::string& path, const std::string& what,
                          const std::string& fix = "give the file itself (a symbolic link to one "
                                                   "is fine)");

}  // namespace kvb
