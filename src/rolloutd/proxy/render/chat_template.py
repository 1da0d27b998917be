"""Chat templates and the session's token chain (``tokens`` capture mode).

The gateway renders prompts with the model's own tokenizer chat template (Hugging Face
``apply_chat_template(..., tools=..., add_generation_prompt=True, tokenize=False)``) and
tokenizes the text with ``add_special_tokens=False`` (the template writes every special token
itself).

The token chain: when a request continues an earlier completion's conversation (the same earlier
messages, the assistant answer that completion returned, then new messages), the next prompt is::

    prompt_ids(c) + response_ids(c) [+ end_of_turn_id when not sampled]
        + tokens(trailer + text the template renders after that assistant turn)

where ``trailer`` is what the template writes after the end-of-turn token of an assistant turn
(``"\\n"`` after ``<|im_end|>`` for Qwen). The model thus sees exactly the tokens it sampled,
and a trace built from the log is exact by construction (no re-tokenisation drift).

Incremental rendering: the text after the continued assistant turn is rendered from a short
stand-in conversation (the first message, the last user message before that turn, that turn,
then the new messages) instead of the whole conversation, so a call costs the same at turn 200
as at turn 2. It is used only for templates that pass a probe at start (the stand-in renders
exactly what the full conversation renders after that turn, over a set of probe conversations:
system or not, tools or not, tool calls and results, several turns); a stand-in that fails to
render or does not end the turn where expected falls back to the full render.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jinja2
import jinja2.sandbox
import structlog

from rolloutd.errors import ConfigError, InvalidRequestError
from rolloutd.proxy.core.fastjson import canonical_json
from rolloutd.proxy.render import template_probes
from rolloutd.proxy.render.jinja_sandbox import lean_template
from rolloutd.proxy.render.messages import (
    ExtensionIndex,
    message_signature,
    template_messages,
)
from rolloutd.types import Completion

log = structlog.get_logger(__name__)

#: encoded turns the chat template keeps (ChatTemplate.encode), at most so many and of so many
#: characters in all (about 20 MB with their ids): each distinct system prompt with its tools,
#: and recent turns
TURN_CACHE_SIZE = 512
TURN_CACHE_CHARS = 2_000_000


@dataclass(frozen=True)
class PromptPlan:
    """A prompt ready to send.

    Attributes:
        prompt_ids: list[int], length P: the prompt tokens.
        extends: index of the completion it continues, or None for a fresh render.
        num_new_tokens: tokens rendered for this request (all P for a fresh render).
    """

    prompt_ids: list[int]
    extends: int | None
    num_new_tokens: int


class ChatTemplate:
    """A tokenizer's chat template, its end-of-turn token, and the token chain.

    Args:
        tokenizer: a transformers tokenizer with a ``chat_template``.

    Raises:
        ConfigError: the tokenizer has no chat template, or its end-of-turn token cannot be
            determined from the template and the tokenizer's special tokens.
    """

    def __init__(self, tokenizer: Any, *, incremental: bool = True) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError("the tokenizer has no chat template")
        self.tokenizer = tokenizer
        # HF fast tokenizers are not safe to share between threads in every mode; renders run
        # in worker threads, so they take turns.
        self._lock = threading.Lock()
        # set by the probes below; None while they run (the probes render and encode
        # through transformers, the reference they compare against)
        self._backend: Any = None
        self._decoder: Any = None
        self._direct: Any = None
        self.turn_start: str | None = None
        #: encoded turns by text (:meth:`encode`), most recently used last, and their size
        self._turn_ids: dict[str, list[int]] = {}
        self._turn_chars = 0
        self._direct = self._probe_direct()
        self.end_of_turn_text, self.trailer = self._find_end_of_turn()
        self.end_of_turn_id = self._single_token_id(self.end_of_turn_text)
        #: render only what follows the continued turn (see the module docstring)
        self.incremental = incremental and self._probe_incremental()
        self._backend = self._probe_backend()
        self._decoder = self._probe_decoder()
        self.turn_start = self._probe_turn_start()

    # -- derivation of the end-of-turn token -------------------------------------------
    def _special_tokens(self) -> list[str]:
        tokens = set()
        eos = getattr(self.tokenizer, "eos_token", None)
        if isinstance(eos, str) and eos:
            tokens.add(eos)
        for added in getattr(self.tokenizer, "added_tokens_decoder", {}).values():
            if getattr(added, "special", False):
                tokens.add(str(added))
        for tok in getattr(self.tokenizer, "all_special_tokens", []):
            tokens.add(tok)
        return sorted(tokens, key=len, reverse=True)

    def _find_end_of_turn(self) -> tuple[str, str]:
        probe = [
            {"role": "user", "content": template_probes.PROBE_USER},
            {"role": "assistant", "content": template_probes.PROBE_ANSWER},
        ]
        text = self._render_text_unlocked(probe, None, add_generation_prompt=False)
        at = text.rfind(template_probes.PROBE_ANSWER)
        if at < 0:
            raise ConfigError("the chat template does not render the assistant's content")
        after = text[at + len(template_probes.PROBE_ANSWER) :]
        for token in self._special_tokens():
            if after.startswith(token):
                return token, after[len(token) :]
        raise ConfigError(
            "cannot determine the chat template's end-of-turn token: the text after an "
            f"assistant turn is {after[:40]!r}, which starts with no special token"
        )

    def _probe_incremental(self) -> bool:
        """Whether the stand-in render equals the full render after every assistant turn of
        the probe conversations (:data:`template_probes.PROBES`), with and without tools."""
        for tools in (None, template_probes.PROBE_TOOLS):
            for conversation in template_probes.PROBES:
                for k, message in enumerate(conversation):
                    if message["role"] != "assistant" or k == len(conversation) - 1:
                        continue
                    try:
                        full = self._after_turn_full(conversation, tools, k)
                        short = self._after_turn_incremental(conversation, tools, k)
                    except InvalidRequestError:
                        continue  # the template refuses this shape: it never chains it
                    if full != short:
                        log.info(
                            "incremental_render_disabled",
                            reason="template renders "
                            "new messages differently after a shortened conversation",
                        )
                        return False
        return True

    def _single_token_id(self, token: str) -> int:
        ids = self.tokenizer.encode(token, add_special_tokens=False)
        if len(ids) != 1:
            raise ConfigError(f"end-of-turn token {token!r} is not one token: {ids}")
        return int(ids[0])

    # -- rendering -----------------------------------------------------------------------
    def _render_text_unlocked(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None,
        add_generation_prompt: bool,
    ) -> str:
        try:
            if self._direct is not None:
                text = self._direct(
                    template_messages(messages),
                    list(tools) if tools else None,
                    add_generation_prompt,
                )
            else:
                text = self.tokenizer.apply_chat_template(
                    template_messages(messages),
                    tools=list(tools) if tools else None,
                    add_generation_prompt=add_generation_prompt,
                    tokenize=False,
                )
        except (jinja2.TemplateError, TypeError, ValueError, KeyError) as e:
            raise InvalidRequestError(f"the chat template cannot render these messages: {e}") from e
        if not isinstance(text, str):
            raise ConfigError(f"apply_chat_template returned {type(text).__name__}, not text")
        return text

    def _probe_direct(self) -> Any:
        """A render of the compiled template without ``apply_chat_template``'s preparation
        of every call (its deep copy of messages, tools and arguments into plain values, a
        third of a render's cost and more with long tools; the values here are plain JSON
        already), when it renders every probe conversation (:data:`template_probes.PROBES` and
        :data:`template_probes.DIRECT_PROBES`, with and without tools and generation prompt)
        exactly as ``apply_chat_template`` does; else None (``apply_chat_template`` renders).

        It keeps the rest of transformers' preparation: keys whose value is None dropped,
        reasoning fields aliased (``_alias_reasoning_fields``), the tokenizer's special
        tokens passed; the template runs in transformers' immutable sandbox, compiled by
        transformers (``_compile_jinja_template``) and recompiled in an overlay of its
        environment whose attribute lookups on plain dicts skip a raised ``AttributeError``
        (:func:`jinja_sandbox.lean_template`): the probe also guards against a change of
        those private names and of the sandbox."""
        try:
            from transformers.utils.chat_template_utils import (
                _alias_reasoning_fields,
                _compile_jinja_template,
            )
        except ImportError:
            return None
        tokenizer = self.tokenizer
        special = dict(tokenizer.special_tokens_map)
        templates: dict[str, Any] = {}  # by source (a tokenizer may have one for tools)

        def direct(
            messages: list[dict[str, Any]],
            tools: list[dict[str, Any]] | None,
            add_generation_prompt: bool,
        ) -> str:
            source = tokenizer.get_chat_template(None, tools)
            compiled = templates.get(source)
            if compiled is None:
                compiled = templates[source] = lean_template(
                    _compile_jinja_template(source), source
                )
            chat = _alias_reasoning_fields(
                [{k: v for k, v in m.items() if v is not None} for m in messages]
            )
            return compiled.render(
                messages=chat,
                tools=tools,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **special,
            )

        for tools in (None, template_probes.PROBE_TOOLS):
            for conversation in (*template_probes.PROBES, *template_probes.DIRECT_PROBES):
                for generation_prompt in (True, False):
                    try:
                        fast = direct(
                            template_messages(conversation),
                            list(tools) if tools else None,
                            generation_prompt,
                        )
                    except Exception:  # noqa: BLE001 - any failure: the wrapper renders
                        fast = None
                    try:
                        slow = self._render_text_unlocked(conversation, tools, generation_prompt)
                    except InvalidRequestError:
                        slow = None
                    if fast != slow:
                        log.info(
                            "direct_render_disabled",
                            reason="the compiled template "
                            "renders a probe differently from apply_chat_template",
                        )
                        return None
        return direct

    def render_text(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = True,
    ) -> str:
        """Render messages and tools to prompt text with the model's template.

        Raises:
            InvalidRequestError: the template rejects the messages.
        """
        with self._lock:
            return self._render_text_unlocked(messages, tools, add_generation_prompt)

    def _probe_backend(self) -> Any:
        """The fast tokenizer's Rust ``tokenizers.Tokenizer``, when it encodes every probe
        conversation (:data:`template_probes.PROBES`, rendered) exactly as ``tokenizer.encode`` does
        (through ``encode_batch_fast``, which skips character offsets), else None.
        transformers' ``encode`` wraps it with padding, truncation and batching logic that
        costs more than encoding a short text (a fresh prompt of 30 tokens: 74 us against
        47 us)."""
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if (
            backend is None
            or getattr(self.tokenizer, "split_special_tokens", False)
            or not hasattr(backend, "encode_batch_fast")
        ):
            return None
        for tools in (None, template_probes.PROBE_TOOLS):
            for conversation in template_probes.PROBES:
                text = self._render_text_unlocked(conversation, tools, True) + " é 日本 \t\n"
                if backend.encode_batch_fast([text], add_special_tokens=False)[0].ids != list(
                    self.tokenizer.encode(text, add_special_tokens=False)
                ):
                    log.warning(
                        "tokenizer_backend_differs",
                        hint="encoding through transformers' wrapper (slower)",
                    )
                    return None
        return backend

    def _probe_turn_start(self) -> str | None:
        """The special token a turn starts with (``<|im_start|>`` for ChatML templates), when
        encoding a rendered conversation turn by turn gives the ids of encoding it whole on
        every probe conversation (:data:`template_probes.PROBES`, with and without tools),
        else None.

        Tokenizers split the text at special tokens before anything else, so a special token
        that neither strips nor joins its neighbours is a safe cut; the probe checks that of
        this tokenizer."""
        user = [{"role": "user", "content": template_probes.PROBE_USER}]
        with_prompt = self._render_text_unlocked(user, None, add_generation_prompt=True)
        without = self._render_text_unlocked(user, None, add_generation_prompt=False)
        if not with_prompt.startswith(without):
            return None
        generation_prompt = with_prompt[len(without) :]
        token = next((t for t in self._special_tokens() if generation_prompt.startswith(t)), None)
        if token is None:
            return None
        for tools in (None, template_probes.PROBE_TOOLS):
            for conversation in template_probes.PROBES:
                text = self._render_text_unlocked(conversation, tools, True)
                whole = self._encode_whole(text)
                if text.count(token) < 2 or self._encode_turns(text, token, cache=False) != whole:
                    return None
        return token

    def _encode_whole(self, text: str) -> list[int]:
        if self._backend is not None:
            # encode_batch_fast skips the character offsets encode computes (and nobody reads)
            return self._backend.encode_batch_fast([text], add_special_tokens=False)[0].ids
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _encode_turns(self, text: str, token: str, *, cache: bool = True) -> list[int]:
        """``text`` encoded turn by turn (cut before each ``token``), each turn's ids from
        the cache when it was encoded before."""
        pieces = text.split(token)
        turns = (
            [pieces[0], *(token + piece for piece in pieces[1:])]
            if pieces[0]
            else [token + piece for piece in pieces[1:]]
        )
        ids: list[int] = []
        for turn in turns:
            cached = self._turn_ids.pop(turn, None) if cache else None
            if cached is None:
                cached = self._encode_whole(turn)
                self._turn_chars += len(turn) if cache else 0
            if cache:
                self._turn_ids[turn] = cached  # (re)inserted last: most recently used
                while len(self._turn_ids) > TURN_CACHE_SIZE or self._turn_chars > TURN_CACHE_CHARS:
                    oldest = next(iter(self._turn_ids))
                    del self._turn_ids[oldest]
                    self._turn_chars -= len(oldest)
            ids += cached
        return ids

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, no special tokens added (the template wrote them).

        Text with the template's turn-start token is encoded turn by turn and each turn's ids
        are kept (the most recently used, :data:`TURN_CACHE_SIZE`): a fresh conversation
        whose system prompt and tools were sent before (every call of a harness that starts
        a new conversation) encodes only its new turns. The ids are those of encoding the
        text whole (checked at start on the probes, :meth:`_probe_turn_start`).
        """
        with self._lock:
            if self.turn_start is not None and self.turn_start in text:
                return self._encode_turns(text, self.turn_start)
            return self._encode_whole(text)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``, special tokens kept (``tokenizer.decode(ids,
        skip_special_tokens=False)``)."""
        with self._lock:
            if self._decoder is not None:
                return self._decoder.decode(list(ids), skip_special_tokens=False)
            return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def _probe_decoder(self) -> Any:
        """The fast tokenizer's Rust ``tokenizers.Tokenizer`` for :meth:`decode`, when it
        decodes the probe conversations (:data:`template_probes.PROBES`, encoded), the special
        tokens, and runs of every id of the vocabulary (bytes cut mid-character included) exactly as
        ``tokenizer.decode`` does, else None. transformers' ``decode`` wraps it (and may clean
        up spaces, which the probe sees): 6.7 us against 2.6 us for a short answer."""
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is None:
            return None
        samples = [
            self._encode_whole(self._render_text_unlocked(conversation, tools, True))
            for tools in (None, template_probes.PROBE_TOOLS)
            for conversation in template_probes.PROBES
        ]
        size = len(self.tokenizer)
        samples += [[self.tokenizer.convert_tokens_to_ids(t) for t in self._special_tokens()]]
        samples += [list(range(start, min(start + 64, size))) for start in range(0, size, 64)]
        try:
            for ids in samples:
                if backend.decode(ids, skip_special_tokens=False) != self.tokenizer.decode(
                    ids, skip_special_tokens=False
                ):
                    log.info(
                        "tokenizer_backend_decode_differs",
                        hint="decoding through transformers' wrapper (slower)",
                    )
                    return None
        except Exception:  # noqa: BLE001 - any failure: transformers decodes
            return None
        return backend

    def render(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None
    ) -> list[int]:
        """Fresh prompt ids with the generation prompt.

        Returns:
            list[int], length P.
        """
        return self.encode(self.render_text(messages, tools, add_generation_prompt=True))

    # -- the token chain -------------------------------------------------------------------
    def find_extended(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]],
        completions: Sequence[Completion] | ExtensionIndex,
    ) -> Completion | None:
        """The completion whose conversation and answer ``messages`` continue, if any.

        A completion ``c`` matches when the request has the same tools, starts with
        ``c.messages`` and then ``c``'s answer (compared by :func:`message_signature`).
        Among matches the longest conversation wins, then the latest.

        Cost: candidates are looked up in an :class:`ExtensionIndex` by conversation length
        and answer signature, longest first, so a session's thousandth call costs what its
        first did; a harness resends the earlier messages unchanged, so a candidate's messages
        are compared as plain values first (one C-level comparison) and by signature only
        when that fails.

        Args:
            messages: the request's messages.
            tools: the request's tools.
            completions: the session's completions so far, in index order, or their
                :class:`ExtensionIndex` (a session keeps one; a list is indexed here).
        """
        index = (
            completions if isinstance(completions, ExtensionIndex) else ExtensionIndex(completions)
        )
        signatures: dict[int, tuple[Any, ...]] = {}

        def signature(i: int) -> tuple[Any, ...]:
            if i not in signatures:
                signatures[i] = message_signature(messages[i])
            return signatures[i]

        tools_key: str | None = None
        for k in index.lengths_below(len(messages)):
            for completion in index.candidates(k, signature(k)):
                if completion.tools != tools:
                    if tools_key is None:
                        tools_key = canonical_json(list(tools))
                    if canonical_json(completion.tools) != tools_key:
                        continue
                if completion.messages != messages[:k] and any(
                    message_signature(m) != signature(i) for i, m in enumerate(completion.messages)
                ):
                    continue
                return completion
        return None

    def _after_turn_full(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None, k: int
    ) -> str | None:
        """The text the template renders after assistant turn ``messages[k]`` (its end-of-turn
        token and trailer excluded) up to the generation prompt, from two full renders; None
        when the conversation up to that turn is not a prefix of the whole or does not end
        with the end-of-turn token and trailer."""
        full_text = self.render_text(messages, tools, add_generation_prompt=True)
        upto_text = self.render_text(messages[: k + 1], tools, add_generation_prompt=False)
        if full_text.startswith(upto_text) and upto_text.endswith(
            self.end_of_turn_text + self.trailer
        ):
            return full_text[len(upto_text) :]
        return None

    def _after_turn_incremental(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None, k: int
    ) -> str | None:
        """:meth:`_after_turn_full` of a stand-in conversation: the first message, the last
        user message before turn ``k``, then ``messages[k:]``; its cost does not depend on
        ``k``."""
        head: list[dict[str, Any]] = []
        if k > 0:
            head.append(messages[0])
            for i in range(k - 1, 0, -1):
                if messages[i].get("role") == "user":
                    head.append(messages[i])
                    break
        return self._after_turn_full([*head, *messages[k:]], tools, len(head))

    def render_chars(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]],
        previous: Completion | None,
    ) -> int:
        """A rough size (characters) of what :meth:`build_prompt` renders and tokenizes for
        this request, given its continued completion ``previous`` (from
        :meth:`find_extended`): callers run small renders inline and large ones in a thread."""
        todo = (
            messages[len(previous.messages) :]
            if previous is not None and self.incremental
            else messages
        )
        size = 600 * len(tools)
        for message in todo:
            content = message.get("content")
            size += len(content) if isinstance(content, str) else 200
            size += 200 * len(message.get("tool_calls") or ())
        return size

    @property
    def busy(self) -> bool:
        """The tokenizer is in use by another thread (an inline call would wait for it)."""
        return self._lock.locked()

    def build_prompt(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]],
        completions: Sequence[Completion] | ExtensionIndex,
        *,
        previous: Completion | None | bool = False,
    ) -> PromptPlan:
        """The prompt of a request: chained onto an earlier completion when it continues one.

        A chained prompt renders only what follows the continued turn (incrementally when the
        template allows it, see the module docstring); a fresh prompt renders once.

        Args:
            messages: the request's messages (OpenAI chat shape).
            tools: the request's tools.
            completions: the session's completions so far, in index order, or their
                :class:`ExtensionIndex`.
            previous: :meth:`find_extended`'s answer when the caller has it already
                (False: find it here).

        Returns:
            The prompt ids and the index of the completion continued (None: fresh render).
            Invariant: a chained prompt starts with ``c.prompt_ids + c.response_ids``.

        Raises:
            InvalidRequestError: the template rejects the messages.
        """
        if previous is False:
            previous = self.find_extended(messages, tools, completions)
        assert previous is None or isinstance(previous, Completion)
        if previous is not None:
            k = len(previous.messages)
            new_text = None
            if self.incremental:
                try:
                    new_text = self._after_turn_incremental(messages, tools, k)
                except InvalidRequestError:
                    new_text = None  # the stand-in is refused; the full render decides
            if new_text is None:
                new_text = self._after_turn_full(messages, tools, k)
            if new_text is not None:
                new_ids = self.encode(self.trailer + new_text)
                closed = (
                    ()
                    if previous.response_ids[-1] == self.end_of_turn_id
                    else (self.end_of_turn_id,)
                )
                return PromptPlan(
                    prompt_ids=[*previous.prompt_ids, *previous.response_ids, *closed, *new_ids],
                    extends=previous.index,
                    num_new_tokens=len(new_ids),
                )
            log.warning(
                "chain_break",
                extends=previous.index,
                reason="rendered conversation does not extend the earlier one",
            )
        prompt_ids = self.encode(self.render_text(messages, tools, add_generation_prompt=True))
        return PromptPlan(prompt_ids=prompt_ids, extends=None, num_new_tokens=len(prompt_ids))
