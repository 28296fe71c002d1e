// ComfyUI refuses a prompt whose node's VALIDATE_INPUTS returns a sentence, before anything runs,
// but it files that one sentence once for every input the method names ("temperature - ...",
// "top_p - ...", ...). collapseRefusals keeps one row per sentence for our nodes, on the input the
// sentence names, so the error dialog and the node's red input show it once. Pure logic (no
// ComfyUI imports): sjd_pac.js applies it to the server's answer, the tests run it in Node.js.

export const VALIDATING_NODES = new Set(["SJDPACSampler", "SJDPACTextToImage", "LoadARImageModel"]);
const REFUSAL = "custom_validation_failed";

/** The sentence of a refusal row: its details without ComfyUI's "<input> - " prefix. */
export function refusalSentence(error) {
  const name = error?.extra_info?.input_name ?? "";
  const details = String(error?.details ?? "");
  return name && details.startsWith(`${name} - `) ? details.slice(name.length + 3) : details;
}

/** Whether the sentence names the input (as tree_width or as "tree width"). */
function names(sentence, input) {
  return !!input && (sentence.includes(input) || sentence.includes(input.replaceAll("_", " ")));
}

/**
 * Collapse the repeated refusal rows of our nodes in a prompt's `node_errors` (in place; also
 * returned). Rows of other kinds and other nodes are left as they are.
 */
export function collapseRefusals(nodeErrors) {
  for (const nodeError of Object.values(nodeErrors ?? {})) {
    if (!VALIDATING_NODES.has(nodeError?.class_type) || !Array.isArray(nodeError.errors)) continue;
    const bySentence = new Map();
    const kept = [];
    for (const error of nodeError.errors) {
      if (error?.type !== REFUSAL) {
        kept.push(error);
        continue;
      }
      const sentence = refusalSentence(error);
      const input = error.extra_info?.input_name;
      const first = bySentence.get(sentence);
      if (!first) {
        const row = { ...error, details: sentence, extra_info: { ...(error.extra_info ?? {}) } };
        bySentence.set(sentence, row);
        kept.push(row);
      } else if (!names(sentence, first.extra_info.input_name) && names(sentence, input)) {
        first.extra_info.input_name = input; // the input the sentence is about gets the red mark
      }
    }
    nodeError.errors = kept;
  }
  return nodeErrors;
}
