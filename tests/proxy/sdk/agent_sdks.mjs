// The official OpenAI and Anthropic SDKs against kvpark-proxy (agent_sdks_test.sh):
// sibling requests over one system head, whole and streamed, in each SDK's own way.
// The second sibling must report the head as cached, and a streamed answer must be
// the whole one. Exit 0 when every check holds; each failure is printed.
//   node agent_sdks.mjs PROXY_URL LLAMA_SERVER_URL MODEL
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';

const [proxyUrl, llamaUrl, model] = process.argv.slice(2);
const failures = [];
const check = (ok, what) => {
  if (!ok) failures.push(what);
  console.log(`${ok ? 'ok' : 'FAIL'}: ${what}`);
};

// A head of a few hundred words of the test model's word pieces, as the C++ tests use.
const pieces = [' the', ' park', ' cache', ' state', ' head', ' token', ' model', ' slot'];
const words = (n, seed) =>
  Array.from({ length: n }, (_, i) => pieces[(i * 7 + seed * 13 + ((i * i) % 5)) % pieces.length]).join('');
const head = `You are an agent.${words(400, 1)}.`;
const user = (n) => `Question ${n}:${words(20, 100 + n)}?`;

async function headTokens() {
  const r = await fetch(`${llamaUrl}/tokenize`, {
    method: 'POST',
    body: JSON.stringify({ content: head }),
  });
  return (await r.json()).tokens.length;
}

async function responses(headSize) {
  const client = new OpenAI({ baseURL: `${proxyUrl}/v1`, apiKey: 'unused' });
  const request = (n) => ({
    model,
    instructions: head,
    input: [{ role: 'user', content: user(n) }],
    max_output_tokens: 8,
    temperature: 0,
  });
  await client.responses.create(request(1));
  const whole = await client.responses.create(request(2));
  const cached = whole.usage?.input_tokens_details?.cached_tokens ?? -1;
  check(cached >= headSize - 16 && cached < whole.usage.input_tokens,
        `responses: the sibling's cached_tokens ${cached} covers the ${headSize}-token head`);
  const stream = client.responses.stream(request(2));
  let deltas = '';
  stream.on('response.output_text.delta', (e) => { deltas += e.delta; });
  const final = await stream.finalResponse();
  check(final.output_text === whole.output_text && deltas === whole.output_text,
        `responses: streamed "${deltas}" equals whole "${whole.output_text}"`);
}

async function messages(headSize) {
  const client = new Anthropic({ baseURL: proxyUrl, apiKey: 'unused' });
  const request = (n) => ({
    model,
    max_tokens: 8,
    temperature: 0,
    system: [{ type: 'text', text: head, cache_control: { type: 'ephemeral' } }],
    messages: [{ role: 'user', content: user(n) }],
  });
  await client.messages.create(request(3));
  const whole = await client.messages.create(request(4));
  const u = whole.usage;
  const prompt = u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens;
  check(u.cache_read_input_tokens >= headSize - 16 && u.cache_read_input_tokens < prompt,
        `messages: the sibling's cache_read_input_tokens ${u.cache_read_input_tokens} covers ` +
        `the ${headSize}-token head`);
  const text = whole.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
  check(whole.type === 'message' && whole.role === 'assistant' && whole.stop_reason !== null,
        `messages: a whole Message (stop_reason ${whole.stop_reason})`);
  // The SDK's MessageStream checks the event order as it accumulates the message.
  const stream = client.messages.stream(request(4));
  let deltas = '';
  stream.on('text', (t) => { deltas += t; });
  const final = await stream.finalMessage();
  const finalText = final.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
  check(finalText === text && deltas === text, `messages: streamed "${deltas}" equals whole "${text}"`);
  check(final.usage.cache_read_input_tokens === u.cache_read_input_tokens ||
        final.usage.cache_read_input_tokens >= headSize - 16,
        `messages: the stream's usage reports ${final.usage.cache_read_input_tokens} cached`);
}

try {
  const headSize = await headTokens();
  check(headSize > 300, `the head is ${headSize} tokens`);
  await responses(headSize);
  await messages(headSize);
} catch (e) {
  failures.push(String(e));
  console.log(`FAIL: ${e.stack ?? e}`);
}
process.exit(failures.length === 0 ? 0 : 1);
