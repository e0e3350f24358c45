// Compiles regular expressions as ECMA-262 with the "u" flag (what ajv does with JSON Schema
// patterns) and runs them on sample strings, for test_schema_patterns.py.
//
//   node regex_check.js SPEC_JSON
//
// SPEC_JSON: {"patterns": [...], "samples": [...]}. Prints one JSON report:
// {"compiled": {pattern: null | error}, "matches": {pattern: [bool per sample]}}; a pattern
// matches a sample when it matches anywhere in it, as JSON Schema's "pattern" does.
"use strict";

const fs = require("fs");

const spec = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const report = { compiled: {}, matches: {} };
for (const pattern of spec.patterns) {
  let re;
  try {
    re = new RegExp(pattern, "u");
  } catch (err) {
    report.compiled[pattern] = String(err.message);
    continue;
  }
  report.compiled[pattern] = null;
  report.matches[pattern] = spec.samples.map((s) => re.test(s));
}
process.stdout.write(JSON.stringify(report));
