// The gateway with the official `openai` npm client (node --test). Started by
// tests/scenario/gateway_openai.sh, which brings a cluster up and passes where it is:
//   GW_URL (http://host:port), GW_TOPOLOGY and GW_BIN (for troupe-top), GW_MODEL.
// Every client has maxRetries 0 so a 429 or 503 is seen as such, not retried away.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import OpenAI from 'openai';

const url = process.env.GW_URL + '/v1';
const model = process.env.GW_MODEL;
const client = (apiKey) => new OpenAI({ baseURL: url, apiKey, maxRetries: 0, timeout: 60000 });
const alpha = client('sk-test-alpha-0001');

// A router metric, as the monitor reports it.
function routerMetric(name) {
  const out = execFileSync(`${process.env.GW_BIN}/troupe-top`, ['--topology', process.env.GW_TOPOLOGY, '--json']);
  const router = JSON.parse(out).actors.find((a) => a.role === 'router');
  return router.metrics.find((m) => m.name === name)?.value ?? 0;
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

test('models list', async () => {
  const list = await alpha.models.list();
  assert.deepEqual(list.data.map((m) => m.id), [model]);
});

test('chat, not streamed', async () => {
  const r = await alpha.chat.completions.create({
    model, messages: [{ role: 'user', content: 'Hello there' }], max_completion_tokens: 4, temperature: 0,
  });
  assert.equal(r.object, 'chat.completion');
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 4);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + 4);
  assert.equal(typeof r.usage.prompt_tokens_details.cached_tokens, 'number');
});

test('chat, streamed with usage', async () => {
  const stream = await alpha.chat.completions.create({
    model, messages: [{ role: 'user', content: 'Tell me' }], max_tokens: 6, stream: true,
    stream_options: { include_usage: true },
  });
  let text = '', finish = null, usage = null, n = 0;
  for await (const chunk of stream) {
    n++;
    if (chunk.choices.length) {
      text += chunk.choices[0].delta.content ?? '';
      finish = chunk.choices[0].finish_reason ?? finish;
    }
    if (chunk.usage) usage = chunk.usage;
  }
  assert.ok(n >= 3, `only ${n} chunks`);
  assert.equal(finish, 'length');
  assert.equal(usage.completion_tokens, 6);
  assert.ok(text.length > 0);
});

test('completions, streamed and not, with logprobs', async () => {
  const r = await alpha.completions.create({ model, prompt: 'In the beginning', max_tokens: 3, logprobs: 0 });
  assert.equal(r.object, 'text_completion');
  assert.equal(r.choices[0].logprobs.token_logprobs.length, 3);
  assert.equal(r.usage.completion_tokens, 3);
  const stream = await alpha.completions.create({ model, prompt: [1, 2, 3], max_tokens: 4, stream: true });
  let pieces = 0, finish = null;
  for await (const c of stream) {
    pieces++;
    finish = c.choices[0]?.finish_reason ?? finish;
  }
  assert.ok(pieces >= 2);
  assert.equal(finish, 'length');
});

// Alternatives are sorted and <= 0; with greedy decoding the chosen token is the most likely one,
// so it is their first entry with an equal logprob (the sampler computes both the same way).
const sortedLogprobs = (lps) => lps.every((v, i) => v <= 0 && (i === 0 || v <= lps[i - 1]));

test('top_logprobs: chat and completions, streamed and not', async () => {
  const r = await alpha.chat.completions.create({
    model, messages: [{ role: 'user', content: 'Name a colour' }], max_tokens: 6, temperature: 0,
    logprobs: true, top_logprobs: 5,
  });
  const content = r.choices[0].logprobs.content;
  assert.equal(content.length, r.usage.completion_tokens);
  for (const e of content) {
    assert.equal(e.top_logprobs.length, 5);
    assert.ok(sortedLogprobs(e.top_logprobs.map((t) => t.logprob)), JSON.stringify(e.top_logprobs));
    assert.ok(e.top_logprobs.some((t) => t.token === e.token), `${e.token} not among its alternatives`);
    assert.equal(e.top_logprobs[0].token, e.token);
    assert.equal(e.top_logprobs[0].logprob, e.logprob);
    assert.deepEqual(e.top_logprobs[0].bytes, e.bytes);
  }
  // Sampled and streamed: each chunk's token with its 3 alternatives.
  const stream = await alpha.chat.completions.create({
    model, messages: [{ role: 'user', content: 'Go on' }], max_tokens: 4, temperature: 1, seed: 11,
    stream: true, logprobs: true, top_logprobs: 3,
  });
  let seen = 0;
  for await (const chunk of stream) {
    for (const e of chunk.choices[0]?.logprobs?.content ?? []) {
      seen++;
      const lps = e.top_logprobs.map((t) => t.logprob);
      assert.equal(lps.length, 3);
      assert.ok(sortedLogprobs(lps) && e.logprob <= lps[0], JSON.stringify(e));
    }
  }
  assert.equal(seen, 4);
  // Completions: logprobs N is a {text: logprob} map per position, the chosen one in it.
  const c = await alpha.completions.create({ model, prompt: 'In the beginning', max_tokens: 3, temperature: 0, logprobs: 2 });
  const l = c.choices[0].logprobs;
  assert.equal(l.top_logprobs.length, 3);
  l.top_logprobs.forEach((m, i) => {
    assert.ok(Object.keys(m).length >= 1 && Object.keys(m).length <= 2, JSON.stringify(m));
    assert.equal(m[l.tokens[i]], l.token_logprobs[i]);
  });
  // Out of range: OpenAI's 400 naming the parameter.
  const bad = async (create, param) => await assert.rejects(create(), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError, String(e));
    assert.equal(e.param, param);
    return true;
  });
  await bad(() => alpha.chat.completions.create({
    model, messages: [{ role: 'user', content: 'x' }], logprobs: true, top_logprobs: 21 }), 'top_logprobs');
  await bad(() => alpha.completions.create({ model, prompt: 'x', logprobs: 6 }), 'logprobs');
});

test('n = 2 with temperature and a seed: two choices, streamed and not', async () => {
  const ask = { model, messages: [{ role: 'user', content: 'Pick one' }], max_tokens: 4, temperature: 1, seed: 21, n: 2 };
  const r = await alpha.chat.completions.create(ask);
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1]);
  assert.ok(r.choices.every((c) => c.finish_reason === 'length' && typeof c.message.content === 'string'));
  assert.notEqual(r.choices[0].message.content, r.choices[1].message.content);   // seeds 21 and 22
  assert.equal(r.usage.completion_tokens, 8);
  const again = await alpha.chat.completions.create(ask);                            // seeded: the same choices
  assert.deepEqual(again.choices.map((c) => c.message.content), r.choices.map((c) => c.message.content));
  const stream = await alpha.chat.completions.create({ ...ask, stream: true, stream_options: { include_usage: true } });
  const text = ['', ''], finish = [null, null];
  let usage = null;
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      text[c.index] += c.delta.content ?? '';
      finish[c.index] = c.finish_reason ?? finish[c.index];
    }
    if (chunk.usage) usage = chunk.usage;
  }
  assert.deepEqual(finish, ['length', 'length']);
  assert.deepEqual(text, r.choices.map((c) => c.message.content));
  assert.equal(usage.completion_tokens, 8);
});

test('cached_tokens on a second turn with a prompt_cache_key', async () => {
  const system = Array.from({ length: 80 }, (_, i) => `verse${i}`).join(' ');
  const ask = () => alpha.chat.completions.create({
    model, messages: [{ role: 'system', content: system }, { role: 'user', content: 'and then?' }],
    max_tokens: 2, prompt_cache_key: 'node-conv', prompt_cache_retention: '24h',
  });
  const first = await ask();
  await sleep(500);
  const second = await ask();
  const cached = second.usage.prompt_tokens_details.cached_tokens;
  assert.ok(cached >= 16 && cached < second.usage.prompt_tokens,
    `cached ${cached} of ${second.usage.prompt_tokens} (first turn: ${first.usage.prompt_tokens_details.cached_tokens})`);
});

test('401 for a wrong key', async () => {
  await assert.rejects(
    client('sk-not-a-key-000').chat.completions.create({ model, messages: [{ role: 'user', content: 'x' }] }),
    (e) => e instanceof OpenAI.AuthenticationError && e.status === 401 && e.code === 'invalid_api_key');
});

test('400s: n, ranges, retention, context length, unknown model', async () => {
  const msgs = [{ role: 'user', content: 'x' }];
  const bad = async (body, param, code) => {
    await assert.rejects(alpha.chat.completions.create({ model, messages: msgs, ...body }), (e) => {
      assert.equal(e.status, 400, JSON.stringify(e.error));
      assert.ok(e instanceof OpenAI.BadRequestError);
      assert.equal(e.param, param);
      if (code) assert.equal(e.code, code);
      return true;
    });
  };
  await bad({ n: 17 }, 'n');
  await bad({ temperature: 9 }, 'temperature');
  await bad({ prompt_cache_key: 'k', prompt_cache_options: { ttl: '10d' } }, 'prompt_cache_options.ttl');
  await bad({ max_tokens: 100000 }, 'messages', 'context_length_exceeded');
  await assert.rejects(alpha.chat.completions.create({ model: 'gpt-4o', messages: msgs }),
    (e) => e instanceof OpenAI.NotFoundError && e.code === 'model_not_found');
});

test('429 with Retry-After past the key\'s requests_per_minute', async () => {
  const limited = client('sk-test-limited-03');
  const one = () => limited.completions.create({ model, prompt: [1, 2], max_tokens: 1 });
  await one();
  await one();
  await assert.rejects(one(), (e) => {
    assert.ok(e instanceof OpenAI.RateLimitError, String(e));
    assert.ok(Number(e.headers.get('retry-after')) >= 1);
    return true;
  });
});

test('503 with Retry-After when the router is full', async () => {
  const tries = Array.from({ length: 6 }, () => alpha.completions.create({
    model, prompt: [4, 5, 6], max_tokens: 200, stream: true,
  }).then(async (s) => { for await (const _ of s); return 'ok'; }, (e) => e));
  const results = await Promise.all(tries);
  const full = results.filter((r) => r instanceof OpenAI.APIError && r.status === 503);
  assert.ok(full.length >= 1, `no 503 among ${results.map(String)}`);
  assert.ok(Number(full[0].headers.get('retry-after')) >= 1);
  assert.ok(results.includes('ok'));
});

test('a client that disconnects mid-stream cancels its request', async () => {
  const before = routerMetric('requests_cancelled');
  const ac = new AbortController();
  const stream = await alpha.completions.create(
    { model, prompt: [7, 7, 7], max_tokens: 2000, stream: true }, { signal: ac.signal });
  let got = 0;
  try {
    for await (const _ of stream) {
      if (++got === 3) ac.abort();   // the SDK ends the iteration (or throws an abort error)
    }
  } catch (e) {
    assert.ok(e instanceof OpenAI.APIUserAbortError || e.name === 'AbortError', String(e));
  }
  // Events that were in the SDK's buffer when it aborted may still be yielded: 3 or a few more,
  // never the whole reply.
  assert.ok(got >= 3 && got < 50, `${got} events after an abort at the third`);
  let now = before;
  for (let i = 0; i < 60 && now <= before; i++) {
    await sleep(500);
    now = routerMetric('requests_cancelled');
  }
  assert.ok(now > before, `router requests_cancelled ${before} -> ${now}`);
});
