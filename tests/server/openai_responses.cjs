// The Responses API through the official `openai` npm client (v4): a tool
// round trip (function_call, then function_call_output, then a final
// answer), non-streaming and streaming, and models.retrieve. Required by
// openai_client.cjs, which passes its client and check().
module.exports = async function responses(client, check) {
  const tools = [{ type: 'function', name: 'get_weather', description: 'Weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 12 } }, required: ['city'], additionalProperties: false } }];
  const question = { role: 'user', content: 'What is the weather in Paris?' };

  for (const stream of [false, true]) {
    const tag = stream ? 'responses (stream)' : 'responses';
    const ask = { model: 'tiny-qwen3moe', input: [question], tools, tool_choice: 'required', temperature: 1, max_output_tokens: 120 };
    let first;
    if (!stream) {
      first = await client.responses.create(ask);
    } else {
      const events = await client.responses.create({ ...ask, stream: true });
      const types = [];
      let args = null;
      for await (const ev of events) {
        types.push(ev.type);
        if (ev.type === 'response.function_call_arguments.done') args = ev.arguments;
        if (ev.type === 'response.completed') first = ev.response;
      }
      check(types[0] === 'response.created' && types[1] === 'response.in_progress', `${tag}: created, in_progress first`);
      check(types.includes('response.output_item.added') && types.includes('response.function_call_arguments.delta') &&
            types.includes('response.output_item.done'), `${tag}: function call item events`);
      check(first && first.output.length === 1 && args === first.output[0].arguments, `${tag}: arguments done == the item's arguments`);
    }
    check(first.status === 'completed' && first.object === 'response', `${tag}: first turn completed`);
    const call = first.output.find((o) => o.type === 'function_call');
    check(call && call.name === 'get_weather' && call.call_id.startsWith('call_'), `${tag}: function_call of get_weather`);
    const parsed = JSON.parse(call.arguments);
    check(typeof parsed.city === 'string' && parsed.city.length <= 12 && Object.keys(parsed).length === 1, `${tag}: arguments match the schema`);

    // The client sends the call back (as the API returned it) with its output; the model answers.
    const answer = { model: 'tiny-qwen3moe', tools, tool_choice: 'none', temperature: 0, max_output_tokens: 12,
      input: [question, call, { type: 'function_call_output', call_id: call.call_id, output: '{"temperature_c": 21}' }] };
    let second;
    if (!stream) {
      second = await client.responses.create(answer);
      check(typeof second.output_text === 'string' && second.output_text.length > 0, `${tag}: final answer text (output_text)`);
    } else {
      const events = await client.responses.create({ ...answer, stream: true });
      let text = '';
      for await (const ev of events) {
        if (ev.type === 'response.output_text.delta') text += ev.delta;
        if (ev.type === 'response.completed' || ev.type === 'response.incomplete') second = ev.response;
      }
      const msg = second.output.find((o) => o.type === 'message');
      check(msg && text.length > 0 && msg.content[0].text === text, `${tag}: streamed final answer == the message item`);
    }
    check(['completed', 'incomplete'].includes(second.status), `${tag}: final turn finished`);
    check(second.usage.input_tokens > first.usage.input_tokens, `${tag}: call and result rendered in the second turn`);
  }

  const m = await client.models.retrieve('tiny-qwen3moe');
  check(m.id === 'tiny-qwen3moe', 'models.retrieve');
  try {
    await client.models.retrieve('gpt-4o');
    check(false, 'models.retrieve of an unknown model rejected');
  } catch (e) {
    check(e.status === 404, 'models.retrieve unknown: 404');
  }
};
