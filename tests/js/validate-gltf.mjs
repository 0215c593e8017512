// Validate glTF/GLB files with the Khronos glTF validator; print one JSON report per file.
// Usage: node validate-gltf.mjs FILE...   (exit status 0; callers read numErrors from the reports)
import { readFile } from "node:fs/promises";
import path from "node:path";
import validator from "gltf-validator";

const reports = [];
for (const file of process.argv.slice(2)) {
  const bytes = new Uint8Array(await readFile(file));
  const report = await validator.validateBytes(bytes, {
    uri: path.basename(file),
    maxIssues: 100,
    externalResourceFunction: async (uri) =>
      new Uint8Array(await readFile(path.resolve(path.dirname(file), decodeURIComponent(uri)))),
  });
  reports.push(report);
}
process.stdout.write(JSON.stringify(reports) + "\n");
