// Runs chat.js's INLINE pattern (the source is the first argument) the way
// inline() does — exec in a loop from lastIndex — over hostile inputs and
// ordinary ones, and prints one JSON line: name → the matched texts' count
// and the first match. Used by TestInlineMarkdownPatternIsLinear.
const re = new RegExp(process.argv[2], "g");
const n = 400000;
const inputs = {
  brackets: "[".repeat(n),
  bracketsThenLink: "[".repeat(n) + "x](https://example.com/)",
  linkOpen: "[a](".repeat(n / 4),
  stars: "**a ".repeat(n / 4),
  urls: "https://.".repeat(n / 9),
  ordinary: "see [site](https://example.com/) and **bold** and `code` and https://example.org/x.",
};
const out = {};
for (const [name, text] of Object.entries(inputs)) {
  re.lastIndex = 0;
  let count = 0;
  let first = "";
  let m;
  while ((m = re.exec(text))) {
    if (!count) first = m[0].slice(0, 60);
    count++;
  }
  out[name] = { count, first };
}
console.log(JSON.stringify(out));
