"""What an output's vectors are: their format (dims, quantization, dtype) and the record of the
model and settings that made them."""
