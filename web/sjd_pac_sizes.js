// The SJD-PAC Sampler's resolution list, narrowed to the sizes of the model its Load AR Image Model
// node names. ComfyUI validates against the static list the server declares (every family's sizes),
// so only the widget's choices change here; the server checks the size against the loaded model
// again at run time. Plain functions (no ComfyUI imports) so a browser test can drive them.

export const RESOLUTION_NODES = new Set(["SJDPACSampler"]);
export const LOADER_TYPE = "LoadARImageModel";
export const ROUTE = "/sjd_pac/resolutions";
const MAX_HOPS = 16; // reroute nodes followed from the sampler's model input

const nodeType = (node) => node?.type ?? node?.comfyClass;

// "default" plus the family's sizes, in the server list's order; the whole list when unknown.
export function offeredResolutions(all, familySizes) {
  if (!Array.isArray(familySizes) || familySizes.length === 0) return [...all];
  const keep = new Set(familySizes);
  return all.filter((v) => v === "default" || keep.has(v));
}

export function keptValue(current, values) {
  return values.includes(current) ? current : "default";
}

function linkOf(graph, id) {
  const links = graph?.links;
  return links?.get?.(id) ?? links?.[id] ?? null;
}

// The Load AR Image Model node feeding node's "model" input (through reroutes), else null.
export function upstreamLoader(graph, node) {
  let current = node;
  const seen = new Set();
  for (let hop = 0; hop < MAX_HOPS; hop++) {
    const inputs = current?.inputs ?? [];
    const input = inputs.find((i) => i.name === "model") ?? (inputs.length === 1 ? inputs[0] : null);
    if (!input || input.link == null) return null;
    const link = linkOf(graph, input.link);
    const origin = link ? graph.getNodeById(link.origin_id) : null;
    if (!origin || seen.has(origin.id)) return null;
    seen.add(origin.id);
    if (nodeType(origin) === LOADER_TYPE) return origin;
    current = origin;
  }
  return null;
}

// Narrow node's resolution widget to familySizes (null: the whole list); a value the family does
// not offer falls back to "default".
export function applyResolutions(node, familySizes) {
  const widget = node?.widgets?.find((w) => w.name === "resolution");
  if (!widget?.options) return false;
  node._sjdAllResolutions ??= [...widget.options.values];
  const values = offeredResolutions(node._sjdAllResolutions, familySizes);
  widget.options.values = values;
  const value = keptValue(widget.value, values);
  if (value !== widget.value) widget.value = value;
  return true;
}

// model name -> Promise of its sizes (or null), one request per name; failures are not kept.
export function createSizeLookup(fetchJson) {
  const cache = new Map();
  return (model) => {
    if (!cache.has(model)) {
      const pending = Promise.resolve()
        .then(() => fetchJson(model))
        .then((data) => (data && Array.isArray(data.resolutions) ? data.resolutions : null))
        .catch(() => null)
        .then((sizes) => {
          if (sizes === null) cache.delete(model);
          return sizes;
        });
      cache.set(model, pending);
    }
    return cache.get(model);
  };
}

export async function refreshResolutions(graph, node, lookup) {
  const loader = upstreamLoader(graph, node);
  const model = loader?.widgets?.find((w) => w.name === "model")?.value;
  const sizes = model == null ? null : await lookup(String(model));
  applyResolutions(node, sizes);
  return sizes;
}
