"""The ONNX front end and back end: loading and importing ModelProto into the IR, exporting the IR back to ONNX, dtype/shape conversion."""
