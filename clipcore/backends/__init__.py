"""Where a batch is encoded: the torch towers, ONNX Runtime graphs, and the parity gate between them."""
