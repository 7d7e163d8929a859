# One rule of -DKVBENCH_EXTRA_POLICIES (cmake/extra_policies.cmake), label `sdk`:
#   cmake -DCASE=<case> -DSRC=<source dir> -DOUT=<scratch dir> -P tests/sdk/check_extra_policies.cmake
# runs kvb_extra_policies in a child cmake on the case's folders (tests/fixtures/sdk/) and prints
# "sdk case <case>: ok" when the child wrote the expected list, or stopped with the expected
# error naming the offending file: no compiler, a second or less per case. Case `configure`
# configures the whole project with the example's folder instead (-DMINJA=<minja dir>).
cmake_minimum_required(VERSION 3.22)
if(NOT CASE OR NOT SRC OR NOT OUT)
  message(FATAL_ERROR "check_extra_policies.cmake: pass -DCASE= -DSRC= -DOUT=")
endif()
set(fx "${SRC}/tests/fixtures/sdk")
get_filename_component(example "${SRC}/examples/policies/cpp/prompt_heavy.cc" REALPATH)

if(INNER)  # the child: the function itself, on DIRS
  include("${SRC}/cmake/extra_policies.cmake")
  kvb_extra_policies(DIRS ${DIRS} BUILTINS "${SRC}/kernels/policies/policies.h" BASE_DIR "${SRC}"
                     OUT_CC "${OUT}/extra_policies.cc" SOURCES_VAR sources)
  file(WRITE "${OUT}/sources.txt" "${sources}")
  return()
endif()

# Per case: the folders, then either the list's entries or a pattern of the error.
set(want_error "")
set(want_stems "")
if(CASE STREQUAL "none")
  set(dirs "")
elseif(CASE STREQUAL "good")
  set(dirs "examples/policies/cpp")  # relative: from the source tree
  set(want_stems prompt_heavy)
elseif(CASE STREQUAL "two_dirs")
  set(dirs "${SRC}/examples/policies/cpp;${fx}/second")
  set(want_stems prompt_heavy second_policy)
elseif(CASE STREQUAL "configure")
  # below, before the child
elseif(CASE STREQUAL "no_dir")
  set(dirs "${fx}/no_such_folder")
  set(want_error "/no_such_folder' is not a folder")
elseif(CASE STREQUAL "empty_dir")
  set(dirs "${fx}/empty")
  set(want_error "holds no \\*\\.cc policy file")
elseif(CASE STREQUAL "no_function")
  set(dirs "${fx}/no_function")
  set(want_error "my_policy\\.cc does not define its registry function `kvb::policies::PolicyInfo my_policy_policy_info\\(\\)`")
elseif(CASE STREQUAL "builtin_stem")
  set(dirs "${fx}/builtin_stem")
  set(want_error "h2o\\.cc: h2o_policy_info\\(\\) is already a built-in")
elseif(CASE STREQUAL "bad_stem")
  set(dirs "${fx}/bad_stem")
  set(want_error "my-policy\\.cc: the file's stem 'my-policy' must be a C\\+\\+ identifier")
elseif(CASE STREQUAL "same_stem")
  set(dirs "${SRC}/examples/policies/cpp;${fx}/same_stem")
  set(want_error "same_stem/prompt_heavy\\.cc and [^ ]*examples/policies/cpp/prompt_heavy\\.cc have the same stem")
else()
  message(FATAL_ERROR "unknown case ${CASE}")
endif()

file(REMOVE_RECURSE "${OUT}")
file(MAKE_DIRECTORY "${OUT}")

# The real project, configured (not built) with the example's folder, CUDA, MPI, tests and
# benchmarks off (about 5 s): the option reaches the function, the list is written, and the
# example is one of kvb_kernels' sources.
if(CASE STREQUAL "configure")
  set(minja "")
  if(MINJA)
    set(minja "-DKVB_MINJA_DIR=${MINJA}")
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} -S "${SRC}" -B "${OUT}" -DCMAKE_BUILD_TYPE=Release
                          -DKVBENCH_CUDA=OFF -DKVBENCH_MPI=OFF -DKVBENCH_TESTS=OFF
                          -DKVBENCH_BENCH=OFF ${minja}
                          "-DKVBENCH_EXTRA_POLICIES=${SRC}/examples/policies/cpp"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "sdk case ${CASE}: configure failed:\n${out}\n${err}")
  endif()
  file(READ "${OUT}/generated/extra_policies.cc" cc)
  file(READ "${OUT}/compile_commands.json" commands)
  string(FIND "${cc}" "{R\"kvbpath(${example})kvbpath\", &prompt_heavy_policy_info}" at)
  string(FIND "${commands}" "${example}" compiled)
  if(at EQUAL -1 OR compiled EQUAL -1)
    message(FATAL_ERROR "sdk case ${CASE}: ${example} not listed or not compiled:\n${cc}")
  endif()
  file(REMOVE_RECURSE "${OUT}")  # a configured tree: megabytes, nothing to keep
  message("sdk case ${CASE}: ok")
  return()
endif()

string(REPLACE ";" "\\;" dirs_arg "${dirs}")
execute_process(COMMAND ${CMAKE_COMMAND} -DINNER=1 -DCASE=${CASE} -DSRC=${SRC} -DOUT=${OUT}
                        "-DDIRS=${dirs_arg}" -P "${CMAKE_CURRENT_LIST_FILE}"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
string(REGEX REPLACE "[ \t\r\n]+" " " err "${err}")  # CMake wraps and indents messages

if(want_error)
  if(rc EQUAL 0)
    message(FATAL_ERROR "sdk case ${CASE}: accepted; expected an error matching: ${want_error}")
  endif()
  if(NOT err MATCHES "${want_error}")
    message(FATAL_ERROR "sdk case ${CASE}: the error does not match '${want_error}':\n${err}")
  endif()
  message("sdk case ${CASE}: ok")
  return()
endif()

if(NOT rc EQUAL 0)
  message(FATAL_ERROR "sdk case ${CASE}: refused:\n${err}")
endif()
file(READ "${OUT}/extra_policies.cc" cc)
file(READ "${OUT}/sources.txt" sources)
if(NOT want_stems)
  if(NOT cc MATCHES "return {};" OR cc MATCHES "_policy_info" OR NOT sources STREQUAL "")
    message(FATAL_ERROR "sdk case ${CASE}: expected an empty list, got:\n${cc}\nsources: ${sources}")
  endif()
  message("sdk case ${CASE}: ok")
  return()
endif()
# Every stem declared and listed, in the given order, with its file's real path.
set(order "")
foreach(stem IN LISTS want_stems)
  if(stem STREQUAL "prompt_heavy")
    set(file "${example}")
  else()
    set(file "${fx}/second/${stem}.cc")
  endif()
  if(NOT cc MATCHES "PolicyInfo ${stem}_policy_info\\(\\);")
    message(FATAL_ERROR "sdk case ${CASE}: ${stem}_policy_info is not declared:\n${cc}")
  endif()
  string(FIND "${cc}" "{R\"kvbpath(${file})kvbpath\", &${stem}_policy_info}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "sdk case ${CASE}: no entry for ${file}:\n${cc}")
  endif()
  list(APPEND order ${at})
  if(NOT "${file}" IN_LIST sources)
    message(FATAL_ERROR "sdk case ${CASE}: ${file} not among the sources: ${sources}")
  endif()
endforeach()
set(sorted ${order})
list(SORT sorted COMPARE NATURAL)
if(NOT sorted STREQUAL order)
  message(FATAL_ERROR "sdk case ${CASE}: entries out of the folders' order:\n${cc}")
endif()
message("sdk case ${CASE}: ok")
