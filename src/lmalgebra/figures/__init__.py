"""The one matplotlib set-up (Agg canvas, no pyplot state) that every figure is drawn on."""
