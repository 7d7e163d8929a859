// Tasks defined in YAML (issue 17; tasks/data_task.h, harness/task_file.h): prompt templates,
// RULER's generated files through the shipped definitions in configs/tasks/ruler (hand-made
// fixtures in RULER's schema, tests/fixtures/tasks/ruler), gzip data, and the errors for bad
// definitions and bad data, each naming the file, the line and the key or field. Files are
// written under KVB_BINARY_DIR/test_task_files.
#include <fcntl.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <sqlite3.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/error.h"
#include "harness/task_file.h"
#include "tasks/jsonl.h"

namespace kvb::harness {
namespace {

// The shipped definitions (configs/tasks) by name: kvbench finds them on the task search path
// (harness/task_file.h), never by a path compiled into it; these tests put them there.
const std::string kShippedTasks = std::string(KVB_FIXTURES_DIR) + "/../../configs/tasks";
[[maybe_unused]] const bool kShippedOnSearchPath = [] {
  return ::setenv("KVBENCH_TASK_PATH", kShippedTasks.c_str(), 1) == 0;
}();
namespace fs = std::filesystem;
using tasks::Prediction;
using tasks::Sample;

const std::string kRuler = KVB_FIXTURES_DIR "/tasks/ruler";
const std::string kDir = KVB_BINARY_DIR "/test_task_files";

std::string write(const std::string& name, const std::string& text) {
  const std::string path = kDir + "/" + name;
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

std::vector<nlohmann::json> raw_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> out;
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

tasks::TaskContext ctx() {
  tasks::TaskContext c;
  c.count_tokens = [](const std::string& s) { return static_cast<int>(s.size() / 4); };
  return c;
}

std::unique_ptr<tasks::Task> task(const std::string& name, std::map<std::string, std::string> kv) {
  return make_any_task(name, Options(std::move(kv), "task option"));
}

double score(const tasks::Task& t, const Sample& s, const std::string& text) {
  Prediction p;
  p.text = text;
  return t.score(s, p).at(t.metrics().at(0).name);
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no kvb::Error thrown";
  return "";
}

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

TEST(PromptTemplate, FieldsBracesAndErrors) {
  // Issue 34 (F2): `{{x}}` is Jinja's field x, as lm-eval writes templates; it used to be
  // Python's escaped braces, the literal text "{x}" (a prompt of 58 tokens instead of ~400, and
  // no word said). Literal braces are still `{{` and `}}` around anything not a field name.
  const tasks::PromptTemplate t = tasks::parse_prompt_template("Q: {query}{{x}} {opt?}}}");
  ASSERT_EQ(t.pieces.size(), 6u);
  EXPECT_EQ(t.pieces[0].text, "Q: ");
  EXPECT_TRUE(t.pieces[1].field);
  EXPECT_EQ(t.pieces[1].text, "query");
  EXPECT_FALSE(t.pieces[1].optional);
  EXPECT_EQ(t.pieces[2].text, "x");
  EXPECT_TRUE(t.pieces[2].field);
  EXPECT_FALSE(t.pieces[2].optional);
  EXPECT_EQ(t.pieces[3].text, " ");
  EXPECT_FALSE(t.pieces[3].field);
  EXPECT_EQ(t.pieces[4].text, "opt");
  EXPECT_TRUE(t.pieces[4].optional);
  EXPECT_EQ(t.pieces[5].text, "}");
  EXPECT_FALSE(t.pieces[5].field);
  const tasks::PromptTemplate lit = tasks::parse_prompt_template("{{\"a\": 1}} {{ {x} }}");
  ASSERT_EQ(lit.pieces.size(), 3u);
  EXPECT_EQ(lit.pieces[0].text, "{\"a\": 1} { ");
  EXPECT_EQ(lit.pieces[1].text, "x");
  EXPECT_EQ(lit.pieces[2].text, " }");
  EXPECT_HAS(error_of([] { tasks::parse_prompt_template("ab {query"); }),
             "'{' at character 4 is never closed");
  EXPECT_HAS(error_of([] { tasks::parse_prompt_template("a } b"); }),
             "a single '}' at character 3");
  EXPECT_HAS(error_of([] { tasks::parse_prompt_template("{two words}"); }), "not a field name");
  EXPECT_HAS(error_of([] { tasks::parse_prompt_template("{}"); }), "not a field name");
}

// Jinja's variable forms, as lm-eval's doc_to_text writes them: `{{ field }}` with or without
// spaces, `{{ field | default('') }}` optional, parse into fields; any other Jinja makes the whole
// template Jinja (rendered by minja: JinjaTaskTemplates below), where `{field}` is refused since
// Jinja would print it as text.
TEST(PromptTemplate, JinjaFieldsAndJinjaMode) {
  const tasks::PromptTemplate t = tasks::parse_prompt_template(
      "{{question}}|{{ question }}|{{  ctx_2-x\t}}|{{ hint | default('') }}|{{hint|default(\"\")}}");
  EXPECT_FALSE(t.is_jinja());
  ASSERT_EQ(t.pieces.size(), 9u);
  for (size_t i : {0u, 2u, 4u, 6u, 8u}) EXPECT_TRUE(t.pieces[i].field) << i;
  EXPECT_EQ(t.pieces[0].text, "question");
  EXPECT_EQ(t.pieces[2].text, "question");
  EXPECT_EQ(t.pieces[4].text, "ctx_2-x");
  EXPECT_FALSE(t.pieces[4].optional);
  EXPECT_EQ(t.pieces[6].text, "hint");
  EXPECT_TRUE(t.pieces[6].optional);
  EXPECT_TRUE(t.pieces[8].optional);
  for (const char* jinja : {"{{ question | upper }}", "{{ doc.question }}", "Q: {{ choices[0] }}",
                            "{{ question | default('x') }}", "{{ f(x) }}",
                            "{% if x %}y{% endif %}", "{# note #}{{ q }}"}) {
    const tasks::PromptTemplate j = tasks::parse_prompt_template(jinja);
    EXPECT_TRUE(j.is_jinja()) << jinja;
    EXPECT_EQ(j.jinja, jinja);
    EXPECT_TRUE(j.pieces.empty());
  }
  // Literal braces stay the simple form's.
  EXPECT_FALSE(tasks::parse_prompt_template("{{\"a\": 1}} {x}").is_jinja());
  EXPECT_HAS(error_of([] { tasks::parse_prompt_template("{{ choices[0] }} and {question}"); }),
             "'{question}' at character 22 is literal text in a Jinja template");
  EXPECT_HAS(error_of([] { tasks::parse_prompt_template("{% if a %}{a?}{% endif %}"); }),
             "write the field as {{ a }}");
}

// Jinja-mode templates render with minja under lm-eval's environment (StrictUndefined,
// keep_trailing_newline), in isolated processes, item by item.
TEST(JinjaTaskTemplates, RenderAsLmEvalDoes) {
  const std::vector<std::string> items = {
      R"({"question": "  What is 2+2? ", "choices": ["3", "4"], "n": 2})",
      R"({"question": "Capital of France?", "choices": ["Paris", "Rome"], "n": 7, "hint": "city"})"};
  const std::string mmlu = "{{question.strip()}}\nA. {{choices[0]}}\nB. {{choices[1]}}\nAnswer:";
  EXPECT_EQ(render_task_jinja(mmlu, "t", items),
            (std::vector<std::string>{"What is 2+2?\nA. 3\nB. 4\nAnswer:",
                                      "Capital of France?\nA. Paris\nB. Rome\nAnswer:"}));
  EXPECT_EQ(render_task_jinja("{% for c in choices %}{{ loop.index }}:{{ c | upper }} {% endfor %}"
                              "{{ n * 2 }}{% if hint is defined %} ({{ hint }}){% endif %}\n",
                              "t", items),
            (std::vector<std::string>{"1:3 2:4 4\n", "1:PARIS 2:ROME 14 (city)\n"}));
  EXPECT_EQ(render_task_jinja("{{ hint | default('none') }}", "t", items),
            (std::vector<std::string>{"none", "city"}));
  // StrictUndefined: a name the item lacks is an error naming it and the item.
  try {
    render_task_jinja("{{ choices[0] }} {{ hint }}", "the question template of d.yaml", items);
    ADD_FAILURE() << "an undefined name rendered";
  } catch (const tasks::TemplateRenderError& e) {
    EXPECT_EQ(e.item(), 0u);
    EXPECT_HAS(std::string(e.what()), "the question template of d.yaml: ");
    EXPECT_HAS(std::string(e.what()), "'hint' is undefined: the item has no field of that name");
  }
  EXPECT_HAS(error_of([&] { render_task_jinja("{{ choices[0 }}", "o.yaml", items); }),
             "o.yaml: the template is not valid Jinja");
  // Many items: several isolated children, in order.
  std::vector<std::string> many;
  for (int i = 0; i < 600; ++i) many.push_back("{\"i\": " + std::to_string(i) + "}");
  const std::vector<std::string> r = render_task_jinja("{{ i + 1 }}", "t", many);
  ASSERT_EQ(r.size(), 600u);
  EXPECT_EQ(r[0], "1");
  EXPECT_EQ(r[599], "600");
}

// Hostile task templates (a definition is input like any other): a loop without end, unbounded
// recursion and a memory bomb each end in a usage error naming the template and the limit it hit,
// inside the isolated renderer, and the process that asked goes on.
TEST(JinjaTaskTemplates, HostileTemplatesHitALimitNotTheProcess) {
  const std::vector<std::string> items = {R"({"q": "x"})"};
  struct Case {
    const char* text;
    const char* limit;
  };
  for (const Case& c : {
           Case{"{% for i in range(1000000000) %}{{ q }}{% endfor %}", "exceeded the memory limit"},
           Case{"{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "exceeded the recursion depth limit"},
           Case{"{% set s = namespace(t='xxxxxxxxxxxxxxxx') %}{% for i in range(40) %}"
                "{% set s.t = s.t ~ s.t %}{% endfor %}{{ s.t | length }}",
                "exceeded the memory limit"},
       }) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::string e =
        error_of([&] { render_task_jinja(c.text, "the question template of evil.yaml", items); });
    EXPECT_HAS(e, "the question template of evil.yaml");
    EXPECT_HAS(e, c.limit);
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 60)
        << c.text;
  }
  // The process that asked still renders.
  EXPECT_EQ(render_task_jinja("{{ q }}!", "t", items), std::vector<std::string>{"x!"});
}

// A definition in lm-eval's Jinja (MMLU's doc_to_text), through the data task: the prompt as
// lm-eval renders it, and an undefined field named with the data file's line.
TEST(JinjaTaskTemplates, ADefinitionInJinja) {
  write("defs/mc.jsonl",
        "{\"question\": \" Which is larger? \", \"choices\": [\"1\", \"2\"], \"answer\": \"2\"}\n"
        "{\"question\": \"Which is smaller?\", \"answer\": \"1\"}\n");
  const std::string def = write(
      "defs/mcq.yaml",
      "data: mc.jsonl\nquestion: \"{{question.strip()}}\\n{% for c in choices %}{{ loop.index }}. "
      "{{ c }}\\n{% endfor %}Answer:\"\nreference: answer\nmetric: qa_f1\n");
  tasks::TaskContext c = ctx();
  c.render_jinja = render_task_jinja;
  auto t = make_any_task("mcq", Options({{"task_file", def}, {"limit", "1"}}, "task option"));
  const std::vector<Sample> s = t->samples(c);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].question, "Which is larger?\n1. 1\n2. 2\nAnswer:");
  t = make_any_task("mcq", Options({{"task_file", def}}, "task option"));
  EXPECT_HAS(error_of([&] { t->samples(c); }), kDir + "/defs/mc.jsonl:2: the question template of");
  EXPECT_HAS(error_of([&] { t->samples(c); }), "'choices' is undefined");
}

// RULER's newer files: "answer_prefix" is its own key and "input" ends with the question.
TEST(TaskFiles, RulerNiahFileRunsUnchanged) {
  const auto t = task("ruler_jsonl_niah_multivalue", {{"data_dir", kRuler}});
  EXPECT_EQ(t->name(), "ruler_jsonl_niah_multivalue");
  EXPECT_EQ(t->metrics().at(0).name, "string_match_all");
  EXPECT_TRUE(t->metrics().at(0).higher_is_better);
  const std::vector<Sample> s = t->samples(ctx());
  const auto raw = raw_lines(kRuler + "/niah_multivalue.jsonl");
  ASSERT_EQ(s.size(), raw.size());
  for (size_t i = 0; i < s.size(); ++i) {
    EXPECT_EQ(s[i].id, std::to_string(raw[i]["index"].get<int>()));
    EXPECT_EQ(s[i].context, raw[i]["input"].get<std::string>());
    EXPECT_EQ(s[i].question, "");
    EXPECT_EQ(s[i].answer_prefix, raw[i]["answer_prefix"].get<std::string>());
    EXPECT_EQ(s[i].references, raw[i]["outputs"].get<std::vector<std::string>>());
    EXPECT_EQ(s[i].max_new_tokens, 128);  // RULER's tokens_to_generate for niah
    EXPECT_TRUE(s[i].chat);
    EXPECT_TRUE(s[i].stop_strings.empty());
    EXPECT_EQ(s[i].fields.at("length"), std::to_string(raw[i]["length"].get<int>()));
    EXPECT_EQ(s[i].fields.at("task_group"), "ruler");
  }
  // RULER's string_match_all in percent: 2 of 4 values found (case-insensitive substring).
  EXPECT_DOUBLE_EQ(score(*t, s[0], " 4321876 and 8765002."), 50.0);
  EXPECT_DOUBLE_EQ(score(*t, s[0], "5550123, 8765002, 1200345, 4321876"), 100.0);
  EXPECT_DOUBLE_EQ(score(*t, s[0], "none"), 0.0);
  EXPECT_FALSE(task("ruler_jsonl_niah_multivalue", {{"data_dir", kRuler}, {"chat", "false"}})
                   ->samples(ctx())[0]
                   .chat);
  EXPECT_EQ(task("ruler_jsonl_niah_multivalue", {{"data_dir", kRuler}, {"limit", "1"}})
                ->samples(ctx())
                .size(),
            1u);
}

// RULER's older files keep the answer prefix at the end of "input"; QA scores string_match_part.
// RULER's own layout <save_dir>/<task>/validation.jsonl is read with data=.
TEST(TaskFiles, RulerQaFileInRulersOwnLayout) {
  fs::create_directories(kDir + "/RULER/4096/qa_1");
  const std::string file = kDir + "/RULER/4096/qa_1/validation.jsonl";
  fs::copy_file(kRuler + "/qa_1.jsonl", file, fs::copy_options::overwrite_existing);
  const auto t = task("ruler_jsonl_qa_1", {{"data", file}});
  EXPECT_EQ(t->metrics().at(0).name, "string_match_part");
  const std::vector<Sample> s = t->samples(ctx());
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].answer_prefix, "");
  EXPECT_EQ(s[0].context.substr(s[0].context.size() - 8), " Answer:");
  EXPECT_EQ(s[0].max_new_tokens, 32);
  EXPECT_EQ(s[0].references, (std::vector<std::string>{"France", "in France"}));
  EXPECT_DOUBLE_EQ(score(*t, s[0], "It lies in FRANCE."), 100.0);  // any one reference suffices
  EXPECT_DOUBLE_EQ(score(*t, s[0], "Paris"), 0.0);
  EXPECT_DOUBLE_EQ(score(*t, s[1], "The Amazon basin."), 100.0);
}

// Every one of the 13 shipped RULER definitions loads, belongs to group ruler and reads
// <data_dir>/<RULER task name>.jsonl.
TEST(TaskFiles, ThirteenRulerDefinitions) {
  const std::vector<std::string> names = {"niah_single_1",
                                          "niah_single_2",
                                          "niah_single_3",
                                          "niah_multikey_1",
                                          "niah_multikey_2",
                                          "niah_multikey_3",
                                          "niah_multivalue",
                                          "niah_multiquery",
                                          "vt",
                                          "cwe",
                                          "fwe",
                                          "qa_1",
                                          "qa_2"};
  for (const std::string& n : names) {
    const std::string file = find_task_file("ruler_jsonl_" + n, {kShippedTasks});
    ASSERT_FALSE(file.empty()) << n;
    const tasks::DataTaskDef d = load_task_file(file);
    EXPECT_EQ(d.group, "ruler");
    EXPECT_EQ(d.data, n + ".jsonl");
    EXPECT_EQ(d.metric, n.rfind("qa_", 0) == 0 ? "string_match_part" : "string_match_all");
    EXPECT_EQ(d.scale, 100);
  }
}

std::string gzip(const std::string& from, const std::string& to, size_t keep_bytes) {
  std::ifstream in(from, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  gzFile out = gzopen(to.c_str(), "wb");
  gzwrite(out, text.data(), static_cast<unsigned>(text.size()));
  gzclose(out);
  if (keep_bytes > 0) fs::resize_file(to, keep_bytes);  // a truncated download
  return to;
}

TEST(TaskFiles, GzipDataReadsTheSameItems) {
  fs::create_directories(kDir);
  const std::string gz = gzip(kRuler + "/niah_multivalue.jsonl", kDir + "/mv.jsonl.gz", 0);
  const auto plain = task("ruler_jsonl_niah_multivalue", {{"data_dir", kRuler}})->samples(ctx());
  const auto zipped = task("ruler_jsonl_niah_multivalue", {{"data", gz}})->samples(ctx());
  ASSERT_EQ(zipped.size(), plain.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_EQ(zipped[i].context, plain[i].context);
    EXPECT_EQ(zipped[i].references, plain[i].references);
  }
  const std::string cut = gzip(kRuler + "/niah_multivalue.jsonl", kDir + "/cut.jsonl.gz", 200);
  EXPECT_HAS(error_of([&] {
               task("ruler_jsonl_niah_multivalue", {{"data", cut}})->samples(ctx());
             }),
             "cut.jsonl.gz");
}

// A definition of a small QA task; `extra` is appended (YAML keys override the ones above).
std::string qa_def(const std::string& name, const std::string& extra,
                   const std::string& metric = "qa_f1") {
  return write("defs/" + name + ".yaml",
               "description: a test task\n"     // line 1
               "data: qa.jsonl\n"               // 2
               "context: \"Doc: {doc}\"\n"      // 3
               "question: \"\\nQ: {query}\"\n"  // 4
               "reference: answers\n"           // 5
               "metric: " +
                   metric + "\n" +  // 6
                   extra);
}

TEST(TaskFiles, BadDefinitionsNameFileLineAndKey) {
  auto err = [](const std::string& name, const std::string& extra,
                const std::string& metric = "qa_f1") {
    const std::string path = qa_def(name, extra, metric);
    return error_of([&] { load_task_file(path); });
  };
  EXPECT_HAS(err("m1", "", "f1"),
             "m1.yaml:6: metric: unknown metric 'f1'; known metrics: "
             "string_match_all");
  EXPECT_HAS(err("m2", "stopp: [x]\n"), "m2.yaml:7: stopp: unknown key 'stopp'");
  EXPECT_HAS(err("m3", "answer_prefix: \"A: {x\"\n"),
             "m3.yaml:7: answer_prefix: a '{' at character 4 is never closed");
  EXPECT_HAS(err("m4", "", "classification"), "m4.yaml:6: metric: classification needs classes:");
  EXPECT_HAS(err("m5", "task: niah\n"), "m5.yaml:7: task: 'niah' is a built-in task");
  EXPECT_HAS(err("m6", "max_new_tokens: 0\n"), "m6.yaml:7: max_new_tokens: 0 is outside");
  EXPECT_HAS(err("m7", "chat: maybe\n"), "m7.yaml:7: chat: 'maybe' is not true or false");
  const std::string noref = write("defs/noref.yaml", "context: \"{doc}\"\nmetric: qa_f1\n");
  EXPECT_HAS(error_of([&] { load_task_file(noref); }), "noref.yaml:1: reference: required");
  const std::string frag = write("defs/_frag.yaml", "metric: qa_f1\n");
  EXPECT_HAS(error_of([&] { load_task_file(frag); }), "fragments for include:");
  // include: cycles and depth are bounded.
  write("defs/cyc_a.yaml", "include: cyc_b.yaml\n");
  write("defs/cyc_b.yaml", "include: cyc_a.yaml\n");
  const std::string cyc = qa_def("cyc", "include: cyc_a.yaml\n");
  EXPECT_HAS(error_of([&] { load_task_file(cyc); }), "include cycle");
  for (int i = 0; i < 40; ++i) {
    write("defs/deep" + std::to_string(i) + ".yaml",
          i == 39 ? "metric: qa_f1\n" : "include: deep" + std::to_string(i + 1) + ".yaml\n");
  }
  const std::string deep = qa_def("deep", "include: deep0.yaml\n");
  EXPECT_HAS(error_of([&] { load_task_file(deep); }), "includes nested deeper than 32 files");
  // An include shares parts; the including file wins.
  write("defs/_shared.yaml", "reference: gold\nmax_new_tokens: 7\nfields: {len: length}\n");
  const std::string inc = qa_def("inc", "include: _shared.yaml\n");
  const tasks::DataTaskDef d = load_task_file(inc);
  EXPECT_EQ(d.name, "inc");
  EXPECT_EQ(d.reference, "answers");
  EXPECT_EQ(d.max_new_tokens, 7);
  ASSERT_EQ(d.fields.size(), 1u);
  EXPECT_EQ(d.fields[0], (std::pair<std::string, std::string>{"len", "length"}));
}

TEST(TaskFiles, BadDataNamesFileLineAndField) {
  const std::string def = qa_def("qa", "fields: [length]\nid: qid\n");
  auto run = [&](const std::string& data) {
    return error_of([&] {
      make_any_task("qa", Options({{"task_file", def}, {"data", data}}, "task option"))
          ->samples(ctx());
    });
  };
  const std::string good =
      "{\"qid\": \"a\", \"doc\": \"d\", \"query\": \"q\", \"answers\": [\"x\"]}\n";
  // A template field the data lacks.
  std::string e = run(write("missing.jsonl", good + "{\"doc\": \"d\", \"answers\": [\"x\"]}\n"));
  EXPECT_HAS(e, "missing.jsonl:2: field 'query' named by the question template of " + def +
                    " is missing; the item has: answers, doc");
  // A reference of the wrong type.
  e = run(write("reftype.jsonl", "{\"doc\": \"d\", \"query\": \"q\", \"answers\": 5}\n"));
  EXPECT_HAS(e,
             "reftype.jsonl:1: the reference field 'answers' must be a string or a list of "
             "strings, not a number");
  e = run(write("refelem.jsonl", "{\"doc\": \"d\", \"query\": \"q\", \"answers\": [\"x\", 2]}\n"));
  EXPECT_HAS(e,
             "refelem.jsonl:1: key 'answers' must be a list of strings; element 1 is an integer");
  // A template field that is not text.
  e = run(write("listfield.jsonl", "{\"doc\": [\"d\"], \"query\": \"q\", \"answers\": \"x\"}\n"));
  EXPECT_HAS(e,
             "listfield.jsonl:1: field 'doc' (named by the context template) must be a string "
             "or a number, not a list");
  // Invalid UTF-8: the byte's offset and its key.
  const std::string bad = "{\"doc\": \"d\", \"query\": \"caf\xE9\", \"answers\": \"x\"}";
  e = run(write("utf8.jsonl", good + bad + "\n"));
  EXPECT_HAS(e, "utf8.jsonl:2: not valid JSON: invalid UTF-8 at byte " +
                    std::to_string(bad.find('\xE9') + 1) +
                    " of the line, in the value of key 'query'");
  // A 50 MB line: over the definitions' 16 MiB default, refused before it is buffered whole.
  {
    std::ofstream big(kDir + "/big.jsonl", std::ios::binary);
    big << good << "{\"doc\": \"" << std::string(size_t{50} << 20, 'a') << "\"}\n";
  }
  e = run(kDir + "/big.jsonl");
  EXPECT_HAS(e,
             "big.jsonl:2: line longer than the reader's limit of 16 MiB; if the line is meant "
             "to be this long, raise max_line_mb: in " +
                 def);
  // No data: where the definition looks and what to give.
  e = error_of([&] {
    make_any_task("qa", Options({{"task_file", def}}, "task option"))->samples(ctx());
  });
  EXPECT_HAS(e, "cannot open data file '" + kDir + "/defs/qa.jsonl'");
  EXPECT_HAS(e, "give --task-opt data_dir=DIR");
  // A good file: ids, kept fields (absent ones left out) and the per-sample max over answers.
  const auto t =
      make_any_task("qa", Options({{"task_file", def},
                                   {"data", write("ok.jsonl",
                                                  "{\"qid\": 7, \"doc\": \"d {x}\", \"query\": "
                                                  "\"q\", \"answers\": [\"red fox\", \"blue\"], "
                                                  "\"length\": 12}\n")}},
                                  "task option"));
  const auto s = t->samples(ctx());
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].id, "7");
  EXPECT_EQ(s[0].context, "Doc: d {x}");  // braces in the data are inert
  EXPECT_EQ(s[0].question, "\nQ: q");
  EXPECT_EQ(s[0].fields.at("length"), "12");
  EXPECT_EQ(s[0].fields.count("task_group"), 0u);
  // qa_f1: "the red fox" vs "red fox" is 1; vs "blue" 0; the max is taken.
  EXPECT_DOUBLE_EQ(score(*t, s[0], "the red fox"), 1.0);
  EXPECT_DOUBLE_EQ(score(*t, s[0], "a red cat"), 0.5);  // P = 1/2, R = 1/2
}

// Issue 31: a kept field may not take the name of a column every result has (`model`, `policy`,
// `unit_key`...), in either form of fields:, and the list of such names is the units table's
// columns (results/schema.sql, context_length and depth excepted: fields fill those on purpose).
TEST(TaskFiles, FieldsMustNotShadowUnitColumns) {
  EXPECT_HAS(error_of([] { load_task_file(qa_def("shadow1", "fields: [length, model]\n")); }),
             "shadow1.yaml:7: fields[1]: 'model' is a column of every result (the unit's own "
             "model); keep the item field under another name: fields: {item_model: model}");
  EXPECT_HAS(error_of([] { load_task_file(qa_def("shadow2", "fields: {policy: strategy}\n")); }),
             "shadow2.yaml:7: fields.policy: 'policy' is a column of every result");
  EXPECT_HAS(error_of([] { load_task_file(qa_def("shadow3", "fields: [unit_key]\n")); }),
             "shadow3.yaml:7: fields[0]: 'unit_key' is a column of every result");
  // Renamed, the item's `model` field is kept.
  EXPECT_EQ(load_task_file(qa_def("shadow4", "fields: {item_model: model}\n")).fields.at(0),
            (std::pair<std::string, std::string>{"item_model", "model"}));

  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(":memory:", &db), SQLITE_OK);
  std::ifstream in(KVB_FIXTURES_DIR "/../../results/schema.sql");
  const std::string schema((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_EQ(sqlite3_exec(db, schema.c_str(), nullptr, nullptr, nullptr), SQLITE_OK)
      << sqlite3_errmsg(db);
  sqlite3_stmt* st = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "SELECT name FROM pragma_table_info('units')", -1, &st, nullptr),
            SQLITE_OK);
  int columns = 0;
  const auto& reserved = reserved_field_names();
  while (sqlite3_step(st) == SQLITE_ROW) {
    const std::string col = reinterpret_cast<const char*>(sqlite3_column_text(st, 0));
    ++columns;
    const bool is_reserved = std::find(reserved.begin(), reserved.end(), col) != reserved.end();
    EXPECT_EQ(is_reserved, col != "context_length" && col != "depth") << col;
  }
  sqlite3_finalize(st);
  sqlite3_close(db);
  EXPECT_GT(columns, 20);
}

// Issue 31: `id:` naming a field an item lacks is refused (it used to number that item instead,
// mixing two kinds of id), after the item's prompt and reference checks.
TEST(TaskFiles, IdFieldMissingFromAnItemIsRefused) {
  const std::string def = qa_def("ids", "id: qid\n");
  const std::string data =
      write("noid.jsonl",
            "{\"qid\": \"a\", \"doc\": \"d\", \"query\": \"q\", \"answers\": [\"x\"]}\n"
            "{\"doc\": \"d\", \"query\": \"q\", \"answers\": [\"x\"], \"id\": 2}\n");
  EXPECT_HAS(error_of([&] {
               make_any_task("ids", Options({{"task_file", def}, {"data", data}}, "task option"))
                   ->samples(ctx());
             }),
             "noid.jsonl:2: the id field 'qid' (id: in " + def +
                 ") is missing; the item has: answers, doc, id, query (fix id:, or drop it to "
                 "number the samples ids-<item number>)");
  // null is missing too; a list is not an id.
  const std::string null_id = write(
      "nullid.jsonl", "{\"qid\": null, \"doc\": \"d\", \"query\": \"q\", \"answers\": [\"x\"]}\n");
  EXPECT_HAS(error_of([&] {
               make_any_task("ids", Options({{"task_file", def}, {"data", null_id}}, "task option"))
                   ->samples(ctx());
             }),
             "nullid.jsonl:1: the id field 'qid'");
  const std::string list_id = write(
      "listid.jsonl", "{\"qid\": [1], \"doc\": \"d\", \"query\": \"q\", \"answers\": [\"x\"]}\n");
  EXPECT_HAS(error_of([&] {
               make_any_task("ids", Options({{"task_file", def}, {"data", list_id}}, "task option"))
                   ->samples(ctx());
             }),
             "listid.jsonl:1: field 'qid' (id) must be a string or a number, not a list");
}

// Issue 31: sample ids key the results, so a repeated id would make one unit of two samples and
// the second would never run. Refused in every data task, naming the file, the id and both lines.
TEST(TaskFiles, DuplicateSampleIdsAreRefusedNamingBothLines) {
  const std::string def = qa_def("dups", "id: qid\n");
  auto samples_of = [&](const std::string& data) {
    return make_any_task("dups", Options({{"task_file", def}, {"data", data}}, "task option"))
        ->samples(ctx());
  };
  const std::string item = "\"doc\": \"d\", \"query\": \"q\", \"answers\": [\"x\"]}\n";
  const std::string three = write("three.jsonl", "{\"qid\": \"a\", " + item + "{\"qid\": \"b\", " +
                                                     item + "\n{\"qid\": \"a\", " + item);
  EXPECT_HAS(error_of([&] { samples_of(three); }),
             kDir + "/three.jsonl:4: sample id \"a\" (the field 'qid' named by id: in " + def +
                 ") repeats the id of line 1; sample ids key the results, so each must name one "
                 "sample: remove the repeated item or give it an id of its own");
  // A number and a string of the same text are one id; control characters are escaped.
  EXPECT_HAS(
      error_of([&] {
        samples_of(write("numstr.jsonl", "{\"qid\": 7, " + item + "{\"qid\": \"7\", " + item));
      }),
      "numstr.jsonl:2: sample id \"7\"");
  EXPECT_HAS(error_of([&] {
               samples_of(write("ctrl.jsonl", "{\"qid\": \"a\\u001b[2J\\nb\", " + item +
                                                  "{\"qid\": \"a\\u001b[2J\\nb\", " + item));
             }),
             "ctrl.jsonl:2: sample id \"a\\u001b[2J\\nb\" (the field 'qid'");
  // A 1 MB id is shown cut, not whole.
  const std::string big(size_t{1} << 20, 'z');
  const std::string e = error_of([&] {
    samples_of(write("bigid.jsonl",
                     "{\"qid\": \"" + big + "\", " + item + "{\"qid\": \"" + big + "\", " + item));
  });
  EXPECT_HAS(e, "bigid.jsonl:2: sample id \"" + std::string(200, 'z') + "…\" (the field 'qid'");
  EXPECT_LT(e.size(), 1000u);
  // limit= stops before the repeat: the samples read are distinct.
  EXPECT_EQ(make_any_task("dups", Options({{"task_file", def}, {"data", three}, {"limit", "2"}},
                                          "task option"))
                ->samples(ctx())
                .size(),
            2u);
  // Without id: the samples are numbered and cannot repeat.
  const std::string numbered = qa_def("numbered", "");
  EXPECT_EQ(
      make_any_task("numbered", Options({{"task_file", numbered}, {"data", three}}, "task option"))
          ->samples(ctx())
          .size(),
      3u);

  // LongBench v1: _id, or <dataset>-<item number> without one (which an explicit _id can repeat).
  const std::string lb = "\"input\": \"q\", \"context\": \"c\", \"answers\": [\"x\"]}\n";
  const std::string lb3 =
      write("lb_dups.jsonl", "{\"_id\": \"same\", " + lb + "{\"_id\": \"other\", " + lb +
                                 "{\"_id\": \"same\", " + lb);
  EXPECT_HAS(error_of([&] {
               task("longbench", {{"dataset", "hotpotqa"}, {"data", lb3}})->samples(ctx());
             }),
             "lb_dups.jsonl:3: sample id \"same\" (key '_id', or <dataset>-<item number> without "
             "it) repeats the id of line 1");
  const std::string lb_mixed =
      write("lb_mixed.jsonl", "{\"_id\": \"hotpotqa-1\", " + lb + "{" + lb);
  EXPECT_HAS(error_of([&] {
               task("longbench", {{"dataset", "hotpotqa"}, {"data", lb_mixed}})->samples(ctx());
             }),
             "lb_mixed.jsonl:2: sample id \"hotpotqa-1\"");
  // LongBench v2.
  const std::string v2 =
      "\"domain\": \"d\", \"difficulty\": \"easy\", \"length\": \"short\", \"question\": \"q\", "
      "\"choice_A\": \"a\", \"choice_B\": \"b\", \"choice_C\": \"c\", \"choice_D\": \"d\", "
      "\"answer\": \"B\", \"context\": \"c\"}\n";
  const std::string v2dups = write("v2_dups.jsonl", "{\"_id\": \"x\", " + v2 + "{\"_id\": \"y\", " +
                                                        v2 + "{\"_id\": \"x\", " + v2);
  EXPECT_HAS(error_of([&] {
               task("longbench_v2", {{"data", v2dups}})->samples(ctx());
             }),
             "v2_dups.jsonl:3: sample id \"x\" (key '_id') repeats the id of line 1");
}

// Issue 31: a data file without items made a task of no samples (validate: 0 units, a sweep that
// "finished"); a FIFO with no writer blocked the open forever. Both are refused now, and a pipe
// with a writer (a shell's <(zcat data.gz)) still reads.
TEST(TaskFiles, EmptyDataAndWriterlessFifoAreRefusedWithoutBlocking) {
  const std::string def = qa_def("emptydata", "");
  auto samples_of = [&](const std::string& data) {
    return make_any_task("emptydata", Options({{"task_file", def}, {"data", data}}, "task option"))
        ->samples(ctx());
  };
  const std::string empty = write("empty.jsonl", "");
  EXPECT_HAS(error_of([&] { samples_of(empty); }),
             empty + ": no items (the file is empty); a data file holds one JSON object per line");
  const std::string blank = write("blank.jsonl", "\n  \n\r\n");
  EXPECT_HAS(error_of([&] { samples_of(blank); }), blank + ": no items (only blank lines)");
  const std::string fifo = kDir + "/fifo.jsonl";
  fs::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  ::alarm(60);  // ends the process if the open blocks, instead of hanging the suite
  EXPECT_HAS(error_of([&] { samples_of(fifo); }), fifo + ": no items (the file is empty)");
  // Text corpora (perplexity) alike: read as empty, which the task refuses.
  EXPECT_EQ(tasks::read_text_file(fifo, "file", "", 1 << 20), "");
  EXPECT_HAS(error_of([&] { task("perplexity", {{"file", fifo}})->samples(ctx()); }),
             "task perplexity: " + fifo + " is empty");
  // With a writer, the pipe is read like a file. The writer (O_RDWR: its open does not wait for a
  // reader) holds the line in the pipe; once the reader has taken it, the writer closes, which is
  // the reader's end of file.
  const int w = ::open(fifo.c_str(), O_RDWR);
  ASSERT_GE(w, 0);
  const std::string line = "{\"doc\": \"d\", \"query\": \"q\", \"answers\": [\"x\"]}\n";
  ASSERT_EQ(::write(w, line.data(), line.size()), static_cast<ssize_t>(line.size()));
  std::thread closer([w] {
    for (int unread = 1; unread > 0;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      if (::ioctl(w, FIONREAD, &unread) != 0) break;
    }
    ::close(w);
  });
  EXPECT_EQ(samples_of(fifo).size(), 1u);
  closer.join();
  ::alarm(0);
}

TEST(TaskFiles, UnknownNamesAndChangedDefinitions) {
  std::string e = error_of([] { task("no_such_task", {}); });
  EXPECT_HAS(e, "unknown task 'no_such_task'");
  EXPECT_HAS(e, "or a task definition no_such_task.yaml under a folder of the task search path (");
  EXPECT_HAS(e, std::filesystem::path(kShippedTasks).lexically_normal().string());  // named
  EXPECT_HAS(e, "Add a folder with --include-path DIR");
  const std::string def = qa_def("changing", "");
  const std::string sha = load_task_file(def).sha256;
  EXPECT_EQ(sha.size(), 64u);
  qa_def("changing", "max_new_tokens: 9\n");
  e = error_of([&] { task("changing", {{"task_file", def}, {"task_sha256", sha}}); });
  EXPECT_HAS(e, "the task definition changed since the sweep was planned");
  e = error_of([&] { task("other_name", {{"task_file", def}}); });
  EXPECT_HAS(e, "defines task 'changing', not 'other_name'");
  e = error_of([&] { task("changing", {{"task_file", def}, {"colour", "red"}}); });
  EXPECT_HAS(e, "colour");
}

// Answer extraction as lm-eval's filter_list (issue 34 F6): hand-computed cases of each step, with
// lm-eval's RegexFilter semantics (findall; a match's first non-empty group; group_select;
// fallback; stripped).
TEST(TaskFilters, StepsFollowLmEvalsSemantics) {
  using K = tasks::FilterStep::Kind;
  auto regex = [](const std::string& p, int select = 0, const std::string& fallback = "[invalid]") {
    tasks::FilterStep f;
    f.kind = K::kRegex;
    f.pattern = p;
    f.group_select = select;
    f.fallback = fallback;
    return f;
  };
  const std::string chatty = "Let me think. The number is 12, no wait: the answer is 4172. ";
  EXPECT_EQ(tasks::apply_filters({regex("answer is (\\d+)")}, chatty), "4172");
  EXPECT_EQ(tasks::apply_filters({regex("\\d+")}, chatty), "12");       // no group: whole match
  EXPECT_EQ(tasks::apply_filters({regex("\\d+", -1)}, chatty), "4172");  // the last match
  EXPECT_EQ(tasks::apply_filters({regex("\\d+", 5)}, chatty), "[invalid]");
  EXPECT_EQ(tasks::apply_filters({regex("#### (\\d+)", 0, "none")}, chatty), "none");
  // Several groups: the first non-empty one of the match.
  EXPECT_EQ(tasks::apply_filters({regex("(yes)|(no)")}, "well, no."), "no");
  // Whitespace around the group is stripped.
  EXPECT_EQ(tasks::apply_filters({regex("A:(.*)")}, "A:  Paris \n"), "Paris");
  tasks::FilterStep lower, upper, strip, lead, first;
  lower.kind = K::kLowercase;
  upper.kind = K::kUppercase;
  strip.kind = K::kStrip;
  lead.kind = K::kRemoveWhitespace;
  first.kind = K::kTakeFirst;
  EXPECT_EQ(tasks::apply_filters({first, strip, lower}, "  Paris IS Big\t"), "paris is big");
  EXPECT_EQ(tasks::apply_filters({upper}, "abc"), "ABC");
  EXPECT_EQ(tasks::apply_filters({lead}, " \n x "), "x ");
  EXPECT_EQ(tasks::apply_filters({}, " as is "), " as is ");
}

// A long prediction: std::regex recurses per character (about 200-300 bytes of stack each), so
// 60,000 characters through `(.+)` overflow a main thread's 8 MiB stack; the filter runs on its
// own 64 MiB stack and gives the match. Past its 64 KiB limit it is an error naming the limit.
TEST(TaskFilters, ALongPredictionIsMatchedOrRefusedNeverACrash) {
  tasks::FilterStep f;
  f.kind = tasks::FilterStep::Kind::kRegex;
  f.pattern = "answer is (.+)";
  const std::string longest = "the answer is " + std::string(60000, 'x');
  EXPECT_EQ(tasks::apply_filters({f}, longest), std::string(60000, 'x'));
  f.pattern = "([a-z ]+)+ is";
  EXPECT_EQ(tasks::apply_filters({f}, std::string(60000, 'a') + " is"),
            std::string(60000, 'a'));
  std::string e;
  try {
    tasks::apply_filters({f}, std::string(70000, 'a'));
  } catch (const Error& x) {
    e = x.what();
  }
  EXPECT_HAS(e, "reads at most 65536 bytes of a prediction, and this one has 70000");
}

// A chatty answer scored through a definition's regex filter: qa_f1 of the whole sentence against
// "4172" (LongBench's normalisation: lowercase, no punctuation, no articles: "let me see answer is
// 4172", six tokens, one right) is 2 x (1/6 x 1) / (1/6 + 1) = 2/7; through the filter, 1.
TEST(TaskFilters, AChattyAnswerScoredThroughARegexFilter) {
  const std::string data =
      write("defs/filter_qa.jsonl", "{\"doc\": \"d\", \"query\": \"q\", \"answers\": [\"4172\"]}\n");
  const std::string plain = qa_def("plain_answer", "");
  const std::string filtered = qa_def(
      "extract_answer",
      "filter_list:\n  - name: get-answer\n    filter:\n"
      "      - {function: regex, regex_pattern: \"answer is (\\\\d+)\"}\n"
      "      - function: take_first\n");
  const std::string answer = "Let me see. The answer is 4172.";
  auto run = [&](const std::string& def, const std::string& name) {
    const auto t = make_any_task(name, Options({{"task_file", def}, {"data", data}}, "task option"));
    return score(*t, t->samples(ctx()).at(0), answer);
  };
  EXPECT_NEAR(run(plain, "plain_answer"), 2.0 / 7, 1e-12);
  EXPECT_DOUBLE_EQ(run(filtered, "extract_answer"), 1.0);
  // Bad filters name the file, line and key.
  EXPECT_HAS(error_of([] {
               load_task_file(qa_def("bad_re", "filter_list:\n  - filter:\n      - "
                                               "{function: regex, regex_pattern: \"(\"}\n"));
             }),
             "bad_re.yaml:9: filter_list[0].filter[0].regex_pattern: regex_pattern '(' is not a "
             "valid regular expression");
  EXPECT_HAS(error_of([] {
               load_task_file(qa_def("bad_fn", "filter_list:\n  - filter:\n      - "
                                               "{function: majority_vote}\n"));
             }),
             "'majority_vote' is not a filter kvbench applies");
  EXPECT_HAS(error_of([] {
               load_task_file(qa_def("two", "filter_list:\n  - filter: [{function: strip}]\n"
                                            "  - filter: [{function: lowercase}]\n"));
             }),
             "give one entry");
}

}  // namespace
}  // namespace kvb::harness
