"""First smoke test of the local engine through the real openai client."""
from openai import OpenAI


def test_chat_completion_returns_ids_and_logprobs(engine_url):
    client = OpenAI(base_url=f"{engine_url}/v1", api_key="EMPTY")
    r = client.chat.completions.create(
        model="smollm2-135m", messages=[{"role": "user", "content": "Say hi"}], max_tokens=8, seed=3,
        logprobs=True, extra_body={"return_token_ids": True})
    choice = r.choices[0]
    ids = choice.model_extra["token_ids"]
    assert r.model_extra["prompt_token_ids"][:1] == [1]
    assert 1 <= len(ids) == len(choice.logprobs.content) == r.usage.completion_tokens <= 8
    assert all(e.logprob <= 0 for e in choice.logprobs.content)
