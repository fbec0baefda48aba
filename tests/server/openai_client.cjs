// Drives a running hmoe server with the official `openai` npm package (v4):
// non-streaming and streaming chat against the fixture's greedy_text, a
// tool-call round trip, completions, an error, an abort mid-stream, and the
// Responses API (openai_responses.cjs).
// Usage: node openai_client.cjs BASE_URL HF_REFERENCE_JSON OPENAI_MODULE_DIR
// Prints one line per check; exits 1 on the first failure.
const [baseURL, refPath, openaiDir] = process.argv.slice(2);
const OpenAI = require(openaiDir);
const ref = JSON.parse(require('fs').readFileSync(refPath, 'utf8'));
const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0 });

function check(cond, what) {
  if (!cond) {
    console.log('FAIL ' + what);
    process.exit(1);
  }
  console.log('ok ' + what);
}

async function health() {
  const r = await fetch(baseURL.replace(/\/v1$/, '') + '/health');
  return r.status === 200;
}

async function main() {
  const models = await client.models.list();
  check(models.data.length === 1 && models.data[0].id === 'tiny-qwen3moe', 'models.list');

  for (const [i, chat] of ref.chats.entries()) {
    const req = {
      model: 'tiny-qwen3moe',
      messages: chat.messages,
      temperature: 0,
      max_tokens: 32,
      chat_template_kwargs: { enable_thinking: chat.enable_thinking },
    };
    const r = await client.chat.completions.create(req);
    check(r.choices[0].message.content === chat.greedy_text, `chat ${i}: greedy_text`);
    check(r.usage.prompt_tokens === chat.ids.length, `chat ${i}: usage.prompt_tokens == len(ids)`);

    const stream = await client.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
    let text = '', usage = null, finish = null;
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices) {
        if (c.delta.content) text += c.delta.content;
        if (c.finish_reason) finish = c.finish_reason;
      }
    }
    check(text === chat.greedy_text && finish === 'length', `chat ${i}: streamed text`);
    check(usage && usage.completion_tokens === 32 && usage.prompt_tokens === chat.ids.length, `chat ${i}: streamed usage`);
  }

  // Tool-call round trip: the client sends tools, an assistant tool call and
  // the tool's result back; the template renders them and the server answers.
  const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
  const base = [{ role: 'user', content: 'What is the weather in Paris?' }];
  const first = await client.chat.completions.create({ model: 'tiny-qwen3moe', messages: base, tools, temperature: 0, max_tokens: 8 });
  check(first.choices[0].message.role === 'assistant', 'tools: first turn answered');
  const withTools = first.usage.prompt_tokens;
  const noTools = (await client.chat.completions.create({ model: 'tiny-qwen3moe', messages: base, temperature: 0, max_tokens: 1 })).usage.prompt_tokens;
  check(withTools > noTools + 50, `tools: rendered into the prompt (${withTools} vs ${noTools} tokens)`);
  const second = await client.chat.completions.create({
    model: 'tiny-qwen3moe', tools, temperature: 0, max_tokens: 8,
    messages: [...base,
      { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }] },
      { role: 'tool', tool_call_id: 'call_1', content: '{"temperature_c": 21}' }],
  });
  check(second.usage.prompt_tokens > withTools, 'tools: tool call and result rendered in the second turn');
  check(typeof second.choices[0].finish_reason === 'string', 'tools: second turn finished');

  const comp = await client.completions.create({ model: 'tiny-qwen3moe', prompt: ref.chats[0].ids, max_tokens: 32, temperature: 0 });
  check(comp.choices[0].text === ref.chats[0].greedy_text, 'completions: greedy_text');

  try {
    await client.chat.completions.create({ model: 'no-such-model', messages: base });
    check(false, 'unknown model rejected');
  } catch (e) {
    check(e.status === 404 && e.error && e.error.code === 'model_not_found', 'unknown model: 404 APIError with code');
  }
  try {
    await client.chat.completions.create({ model: 'tiny-qwen3moe', messages: [] });
    check(false, 'empty messages rejected');
  } catch (e) {
    check(e.status === 400 && e.error.param === 'messages', 'empty messages: 400 with param');
  }

  // Abort mid-stream: the client stops reading; the server keeps serving.
  const ctl = new AbortController();
  const long = await client.chat.completions.create(
    { model: 'tiny-qwen3moe', messages: base, temperature: 0, max_tokens: 3000, stream: true }, { signal: ctl.signal });
  let n = 0;
  try {
    for await (const chunk of long) {
      if (++n === 5) ctl.abort();
    }
  } catch (e) {
    // the SDK throws APIUserAbortError or AbortError
  }
  check(n >= 5, 'abort: stream started');
  check(await health(), 'abort: /health still answers');
  let running = -1;
  for (let i = 0; i < 200 && running !== 0; ++i) {
    const m = await (await fetch(baseURL.replace(/\/v1$/, '') + '/metrics')).text();
    running = Number(/\nhmoe_num_requests_running (\d+)/.exec(m)[1]);
    if (running !== 0) await new Promise((r) => setTimeout(r, 25));
  }
  check(running === 0, 'abort: sequence cancelled on the server');
  await require('./openai_responses.cjs')(client, check);
  console.log('ALL OK');
}

main().catch((e) => {
  console.log('FAIL exception: ' + (e && e.stack ? e.stack : e));
  process.exit(1);
});
