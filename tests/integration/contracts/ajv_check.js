// Compiles JSON Schemas with ajv's strict mode and validates documents against them, for
// tests/integration/contracts/test_schemas_ajv.py.
//
//   node ajv_check.js NODE_MODULES_PARENT SPEC_JSON
//
// SPEC_JSON: {"schemas": {name: file}, "documents": [[schema name, file], ...]}. Prints one JSON
// report: {"compiled": {name: null | error}, "validated": {file: null | [errors]}}.
"use strict";

const fs = require("fs");

const [modules, specPath] = process.argv.slice(2);
const load = (name) => {
  const mod = require(require.resolve(name, { paths: [modules] }));
  return mod.default || mod;
};
const Ajv2020 = load("ajv/dist/2020");
const addFormats = load("ajv-formats");
const readJson = (file) => JSON.parse(fs.readFileSync(file, "utf8"));

const spec = readJson(specPath);
const report = { compiled: {}, validated: {} };
const validators = {};
for (const [name, file] of Object.entries(spec.schemas)) {
  // One instance per schema, as a consumer loading one file would have. strict: true turns
  // every strict-mode check into an error: unknown keywords and formats, types a keyword
  // needs but the schema does not state, loose tuples, required names never defined.
  const ajv = new Ajv2020({ strict: true, allErrors: true });
  addFormats(ajv);
  try {
    validators[name] = ajv.compile(readJson(file));
    report.compiled[name] = null;
  } catch (err) {
    report.compiled[name] = String(err.message);
  }
}
for (const [name, file] of spec.documents) {
  const validate = validators[name];
  if (!validate) {
    report.validated[file] = [`schema ${name} did not compile`];
  } else if (validate(readJson(file))) {
    report.validated[file] = null;
  } else {
    report.validated[file] = validate.errors.map((e) => `${e.instancePath} ${e.message}`);
  }
}
process.stdout.write(JSON.stringify(report));
