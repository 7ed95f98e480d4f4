// SPDX-License-Identifier: MIT
// Parses RateLimit fields with structured-headers (npm; RFC 9651), a
// parser allot's authors did not write. Reads JSON lines
//   {"field": "RateLimit-Policy"|"RateLimit", "value": "...",
//    "name": "<the policy's name, as it should read once parsed>",
//    "where": "<what wrote it>"}
// and checks each value is a List of one Item: a String equal to
// `name`, with exactly the parameters q and w (RateLimit-Policy) or r
// and t (RateLimit), each a non-negative Integer. Prints one line per
// failure and a count; exits 1 on any failure. tests/headers_sf_check.py.
import { parseList } from "structured-headers";
import { createInterface } from "node:readline";

const want = { "RateLimit-Policy": ["q", "w"], RateLimit: ["r", "t"] };
let n = 0;
let bad = 0;

function fail(rec, why) {
  bad++;
  console.log(`FAIL ${rec.where}: ${rec.field}: ${JSON.stringify(rec.value)}: ${why}`);
}

function check(rec) {
  let list;
  try {
    list = parseList(rec.value);
  } catch (e) {
    return fail(rec, `not a structured-field List (${e.message})`);
  }
  if (list.length !== 1)
    return fail(rec, `${list.length} members, expected one`);
  const [item, params] = list[0];
  if (typeof item !== "string")
    return fail(rec, `its item is a ${typeof item}, expected a String`);
  if (item !== rec.name)
    return fail(rec, `names ${JSON.stringify(item)}, expected ${JSON.stringify(rec.name)}`);
  const keys = [...params.keys()].sort();
  const expect = [...want[rec.field]].sort();
  if (JSON.stringify(keys) !== JSON.stringify(expect))
    return fail(rec, `parameters ${keys}, expected ${expect}`);
  for (const [k, v] of params)
    if (!Number.isInteger(v) || v < 0)
      return fail(rec, `${k}=${v}: expected a non-negative Integer`);
}

const rl = createInterface({ input: process.stdin });
for await (const line of rl) {
  if (!line.trim()) continue;
  const rec = JSON.parse(line);
  if (!(rec.field in want)) {
    fail(rec, "an unknown field");
    continue;
  }
  n++;
  check(rec);
}
console.log(`sf_check: ${n} fields, ${bad} failed`);
process.exit(bad || !n ? 1 : 0);
