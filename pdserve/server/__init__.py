"""The OpenAI-compatible HTTP server over the live driver: routes, strict request schemas
and validation, chat templates, responses and streaming, logprobs, errors, the live
dashboard, the `pdserve serve` start-up and its connections' header deadline."""
