"""The OpenAI-compatible HTTP server over the live driver: routes, strict request schemas
and validation, chat templates, responses and streaming, logprobs, errors, the live
dashboard, and the `pdserve serve` start-up."""
