# Writes OUT, a header that defines KVB_GIT_REV as the revision of the git work tree SRC: the
# commit's 12-digit short hash, "-dirty" appended when a tracked file differs from that commit,
# or "unknown" when SRC is not a git work tree (or git is missing). Run at every build (the
# kvb_git_rev target), so that a binary names the tree it was built from and not the one CMake
# was configured in; OUT is rewritten only when its text changes, so an unchanged tree
# recompiles nothing.
#   cmake -DSRC=<source dir> -DOUT=<header> -P cmake/git_rev.cmake
cmake_minimum_required(VERSION 3.22)  # the project's; script mode starts with no policies set
if(NOT SRC OR NOT OUT)
  message(FATAL_ERROR "git_rev.cmake: pass -DSRC=<source dir> -DOUT=<header>")
endif()
set(rev "unknown")
find_program(KVB_GIT git)
if(KVB_GIT)
  execute_process(COMMAND ${KVB_GIT} rev-parse --short=12 HEAD WORKING_DIRECTORY ${SRC}
                  OUTPUT_VARIABLE head OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET
                  RESULT_VARIABLE head_rc)
  if(head_rc EQUAL 0 AND head MATCHES "^[0-9a-f]+$")
    set(rev "${head}")
    # Tracked files against HEAD, by content (untracked files, such as build folders, do not
    # count). --no-optional-locks: a build never writes the repository's index.
    execute_process(COMMAND ${KVB_GIT} --no-optional-locks diff --quiet HEAD --
                    WORKING_DIRECTORY ${SRC} RESULT_VARIABLE diff_rc OUTPUT_QUIET ERROR_QUIET)
    if(diff_rc EQUAL 1)
      string(APPEND rev "-dirty")
    elseif(NOT diff_rc EQUAL 0)
      set(rev "${head}-unknown-state")
    endif()
  endif()
endif()
set(text "// Written by cmake/git_rev.cmake at build time: the revision of the source tree.\n")
string(APPEND text "#define KVB_GIT_REV \"${rev}\"\n")
set(old "")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUT}" "${text}")
endif()
