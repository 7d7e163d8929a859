// Jinja text templates over JSON objects: a data task's prompt templates written as lm-eval writes
// doc_to_text (tasks/data_task.h "Jinja mode"), rendered with the interpreter and the guard of the
// chat templates (jinja_chat_template.h, render_sandbox.h) and lm-eval's environment: the item's
// fields as the template's variables, StrictUndefined (a name the item lacks is an error naming
// it, except where the template gives it a default: `x | default(...)`, `x is defined`),
// keep_trailing_newline, no trim_blocks or lstrip_blocks.
#pragma once

#include <string>
#include <vector>

#include "workers/tokenizer/render_sandbox.h"

namespace kvb::tokenizer {

// The template rendered over each item (a JSON object's text), in order. The renders run in
// isolated child processes (a few hundred items each) under `limits`. A template that is not
// valid Jinja, or that fails on an item (an undefined name, raise_exception, a type error), throws
// tasks::TemplateRenderError naming `origin`, the item's index and the template's message; one
// that exceeds a limit or crashes the renderer throws a usage error naming origin and the limit.
std::vector<std::string> render_jinja_items(const std::string& text, const std::string& origin,
                                            const std::vector<std::string>& items_json,
                                            const SandboxLimits& limits = SandboxLimits{});

}  // namespace kvb::tokenizer
