// ComfyUI front-end extension of sjd-pac: a live chart on the SJD-PAC Sampler node (tokens accepted
// per forward pass and the running step compression), fed by the server's "sjd_pac.progress"
// messages, the summary text drawn on the SJD Stats node after it runs, and the sampler's
// resolution list narrowed to the sizes of the model its loader names (sjd_pac_sizes.js), and a
// refusal of our nodes' inputs shown once, not once per input (sjd_pac_errors.js).
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";
import { SUMMARY_FONT, SUMMARY_LINE_HEIGHT, applyProgress, drawChart, emptyChart, summaryLayout } from "./sjd_pac_chart.js";
import { collapseRefusals } from "./sjd_pac_errors.js";
import { LOADER_TYPE, RESOLUTION_NODES, ROUTE, createSizeLookup, refreshResolutions } from "./sjd_pac_sizes.js";

const lookupSizes = createSizeLookup(async (model) => {
  const response = await api.fetchApi(`${ROUTE}?model=${encodeURIComponent(model)}`);
  return response.ok ? response.json() : null;
});

function refreshNode(node) {
  refreshResolutions(node.graph ?? app.graph, node, lookupSizes).catch(() => {});
}

function refreshAllSamplers() {
  const graph = app.graph;
  for (const node of graph?._nodes ?? graph?.nodes ?? []) {
    if (RESOLUTION_NODES.has(node.type ?? node.comfyClass)) refreshNode(node);
  }
}

const CHART_NODES = new Set(["SJDPACSampler", "SJDPACTextToImage"]);
const CHART_HEIGHT = 120;

function chartWidget(node) {
  return {
    name: "sjd_pac_chart",
    type: "sjd_pac_chart",
    value: "",
    serialize: false, // not saved in widgets_values (keeps them as the server expects)...
    options: { serialize: false }, // ...and not sent as an input in the API prompt
    computeSize(width) {
      return [width, CHART_HEIGHT];
    },
    draw(ctx, _node, width, y) {
      drawChart(ctx, node._sjdChart || emptyChart(), 10, y + 2, width - 20, CHART_HEIGHT - 6);
    },
  };
}

// The summary widget is as tall as its text: after a run the SJD Stats node grows to show every
// line (warnings, settings, wall time, speedup); nothing is cut off.
const PLACEHOLDER = "Run the graph to see the summary.";

function textWidget(node) {
  return {
    name: "sjd_pac_summary",
    type: "sjd_pac_summary",
    value: "",
    serialize: false,
    options: { serialize: false },
    computeSize(width) {
      return [width, summaryLayout(node._sjdText || PLACEHOLDER, width, node._sjdCharWidth).height];
    },
    draw(ctx, _node, width, y) {
      ctx.save();
      ctx.font = SUMMARY_FONT;
      node._sjdCharWidth = ctx.measureText("0").width || node._sjdCharWidth;
      const { lines, height } = summaryLayout(node._sjdText || PLACEHOLDER, width, node._sjdCharWidth);
      ctx.fillStyle = "#ddd";
      lines.forEach((line, i) => {
        ctx.fillText(line, 10, y + 12 + i * SUMMARY_LINE_HEIGHT);
      });
      ctx.restore();
      fitSummary(node, y + height);
    },
  };
}

/** Grow the node (never shrink it) until its summary, which ends `bottom` px below the node's
 * top at the node's own width, fits: after a run, a resize, or a font wider than assumed. */
function fitSummary(node, bottom) {
  const needed = Math.ceil(bottom) + 4;
  if (needed > node.size[1] + 0.5) {
    node.setSize([node.size[0], needed]);
    node.setDirtyCanvas(true, true);
  }
}

const EXTENSION = "sjd_pac.live_chart";

/** The front end queues every prompt through api.queuePrompt and shows the node_errors of its
 * answer (a 400's on the error it throws): collapse our nodes' repeated refusal rows there. */
function collapseRefusalsOfQueuedPrompts() {
  const queuePrompt = api.queuePrompt;
  if (typeof queuePrompt !== "function" || queuePrompt.sjdPacCollapses) return;
  const wrapped = async function (...args) {
    try {
      const answer = await queuePrompt.apply(this, args);
      collapseRefusals(answer?.node_errors);
      return answer;
    } catch (error) {
      collapseRefusals(error?.response?.node_errors);
      throw error;
    }
  };
  wrapped.sjdPacCollapses = true;
  api.queuePrompt = wrapped;
}

// Two copies of the pack (a Manager install beside a git clone) both serve this file: the front end
// throws on a second registration of one name, so the second copy steps aside (its nodes are the
// same; the Python side says which copies are loaded).
const extension = {
  name: EXTENSION,

  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (CHART_NODES.has(nodeData.name)) {
      const onNodeCreated = nodeType.prototype.onNodeCreated;
      nodeType.prototype.onNodeCreated = function () {
        const r = onNodeCreated?.apply(this, arguments);
        this._sjdChart = emptyChart();
        this.addCustomWidget(chartWidget(this));
        return r;
      };
    }
    if (RESOLUTION_NODES.has(nodeData.name)) {
      const onConnectionsChange = nodeType.prototype.onConnectionsChange;
      nodeType.prototype.onConnectionsChange = function () {
        const r = onConnectionsChange?.apply(this, arguments);
        refreshNode(this);
        return r;
      };
      const onConfigure = nodeType.prototype.onConfigure;
      nodeType.prototype.onConfigure = function () {
        const r = onConfigure?.apply(this, arguments);
        setTimeout(() => refreshNode(this), 0); // after the graph's links are in place
        return r;
      };
    }
    if (nodeData.name === LOADER_TYPE) {
      const onNodeCreated = nodeType.prototype.onNodeCreated;
      nodeType.prototype.onNodeCreated = function () {
        const r = onNodeCreated?.apply(this, arguments);
        const widget = this.widgets?.find((w) => w.name === "model");
        if (widget) {
          const callback = widget.callback;
          widget.callback = function () {
            const out = callback?.apply(this, arguments);
            refreshAllSamplers();
            return out;
          };
        }
        return r;
      };
    }
    if (nodeData.name === "SJDStats") {
      const onNodeCreated = nodeType.prototype.onNodeCreated;
      nodeType.prototype.onNodeCreated = function () {
        const r = onNodeCreated?.apply(this, arguments);
        this.addCustomWidget(textWidget(this));
        return r;
      };
      const onExecuted = nodeType.prototype.onExecuted;
      nodeType.prototype.onExecuted = function (message) {
        onExecuted?.apply(this, arguments);
        this._sjdText = (message?.text || []).join("\n");
        this.setDirtyCanvas(true, true); // the next draw grows the node if the summary needs it
      };
    }
  },

  async setup() {
    collapseRefusalsOfQueuedPrompts();
    api.addEventListener("sjd_pac.progress", ({ detail }) => {
      if (!detail || detail.node == null) return;
      const node = app.graph?.getNodeById?.(Number(detail.node)) ?? app.graph?.getNodeById?.(detail.node);
      if (!node || !CHART_NODES.has(node.type ?? node.comfyClass)) return;
      node._sjdChart = applyProgress(node._sjdChart, detail);
      node.setDirtyCanvas(true, false);
    });
  },
};

if (!(app.extensions ?? []).some((e) => e.name === EXTENSION)) app.registerExtension(extension);

