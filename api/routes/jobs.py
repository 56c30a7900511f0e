"""``/v1/jobs``: submit (upload or ``s3://`` source), list, read, fetch transcripts, cancel."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from sqlalchemy import func, select
from starlette.concurrency import run_in_threadpool

from api import services
from api.deps import DispatcherDep, KeyDep, SessionsDep, SettingsDep
from api.schemas import ErrorBody, Format, JobCreated, JobDetail, JobOptions, JobPage, JobSourceRequest, JobStatus
from api.upload import FIELDS, receive_upload
from workers.db_models import DONE, Job, Recording
from workers.object_store import SourceNotAllowed, check_allowed, parse_s3_uri, s3_client

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

JSON_MAX_BYTES = 65536
MEDIA_TYPES = {"txt": "text/plain", "srt": "application/x-subrip", "vtt": "text/vtt", "json": "application/json"}
_UPLOAD_SCHEMA = {
    "type": "object",
    "required": ["file"],
    "properties": {
        "file": {"type": "string", "format": "binary", "description": "A recording or a zip/tar archive."},
        "pair": {"type": "string", "maxLength": 300},
        "language": {"type": "string", "maxLength": 16, "example": "en"},
        "formats": {"type": "string", "description": "Comma-separated txt,srt,vtt,json", "example": "srt,txt"},
        "output_prefix": {"type": "string", "example": "s3://lectures/transcripts/"},
        "callback_url": {"type": "string", "format": "uri"},
    },
}
_SUBMIT_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/JobSourceRequest"}},
            "multipart/form-data": {"schema": _UPLOAD_SCHEMA},
        },
    }
}
_ERRORS = {401: {"model": ErrorBody}, 404: {"model": ErrorBody}}


def _options(data: dict, model: type[JobOptions] = JobOptions) -> JobOptions:
    """Validate submission options as a 422 on failure."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors(include_url=False, include_context=False)) from None


def _check_output(options: JobOptions, settings) -> None:
    if options.output_prefix:
        try:
            check_allowed(options.output_prefix, settings)
        except SourceNotAllowed as exc:
            raise HTTPException(400, f"output_prefix: {exc}") from None


@router.post(
    "",
    status_code=202,
    response_model=JobCreated,
    openapi_extra=_SUBMIT_BODY,
    responses={400: {"model": ErrorBody}, 401: {"model": ErrorBody}, 413: {"model": ErrorBody},
               415: {"model": ErrorBody}, 422: {"model": ErrorBody}},
)  # fmt: skip
async def submit(
    request: Request, key_id: KeyDep, settings: SettingsDep, sessions: SessionsDep, dispatch: DispatcherDep
) -> JobCreated:
    """Submit a job: a multipart upload (streamed to S3) or JSON naming an ``s3://`` object or prefix."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type == "application/json":
        body = await request.body()
        if len(body) > JSON_MAX_BYTES:
            raise HTTPException(413, "JSON body too large")
        try:
            request_model = JobSourceRequest.model_validate_json(body)
        except ValidationError as exc:
            raise RequestValidationError(exc.errors(include_url=False, include_context=False)) from None
        try:
            check_allowed(request_model.source, settings)
        except SourceNotAllowed as exc:
            raise HTTPException(400, str(exc)) from None
        _check_output(request_model, settings)
        inputs, source = [request_model.source], request_model.source
        job_id = await run_in_threadpool(
            services.create_job, sessions, dispatch, settings, inputs=inputs, source=source,
            options=request_model, api_key_id=key_id,
        )  # fmt: skip
        return JobCreated(job_id=job_id, inputs=inputs)
    if content_type != "multipart/form-data":
        raise HTTPException(415, "send multipart/form-data (an upload) or application/json (an s3:// source)")
    job_id = uuid.uuid4().hex
    received = await receive_upload(request, settings, job_id)
    try:
        fields = {k: v for k, v in received.fields.items() if k in FIELDS and v != ""}
        if "formats" in fields:
            fields["formats"] = [f.strip() for f in fields["formats"].split(",") if f.strip()]
        options = _options(fields)
        _check_output(options, settings)
        await run_in_threadpool(
            services.create_job, sessions, dispatch, settings, inputs=[received.uri], source=received.filename,
            options=options, api_key_id=key_id, job_id=job_id,
        )  # fmt: skip
    except BaseException:
        bucket, key = parse_s3_uri(received.uri)
        await run_in_threadpool(s3_client(settings).delete_object, Bucket=bucket, Key=key)
        raise
    return JobCreated(job_id=job_id, inputs=[received.uri])


@router.get("", response_model=JobPage, responses={401: {"model": ErrorBody}})
def list_jobs(
    key_id: KeyDep,
    sessions: SessionsDep,
    status: Annotated[JobStatus | None, Query(description="Only jobs in this state.")] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
) -> JobPage:
    """This key's jobs, newest first."""
    where = [Job.api_key_id == key_id] + ([Job.status == status] if status else [])
    with sessions() as session:
        total = session.scalar(select(func.count()).select_from(Job).where(*where))
        rows = session.scalars(
            select(Job).where(*where).order_by(Job.created_at.desc(), Job.id).limit(limit).offset(offset)
        ).all()
        return JobPage(items=[services.summary(j) for j in rows], total=total or 0, limit=limit, offset=offset)


@router.get("/{job_id}", response_model=JobDetail, responses=_ERRORS)
def get_job(job_id: str, key_id: KeyDep, sessions: SessionsDep) -> JobDetail:
    """Status, recordings, chunk progress, ETA, acceptance rate, real-time factor and errors."""
    with sessions() as session:
        job = services.owned_job(session, job_id, key_id)
        if job is None:
            raise HTTPException(404, "no such job")
        return services.detail(session, job)


@router.get(
    "/{job_id}/recordings/{recording_id}/transcript",
    response_class=Response,
    responses={**_ERRORS, 409: {"model": ErrorBody}, 200: {"content": {t: {} for t in MEDIA_TYPES.values()}}},
)
def get_transcript(
    job_id: str, recording_id: int, key_id: KeyDep, sessions: SessionsDep, format: Format = "txt"
) -> Response:
    """One finished recording's transcript as txt, srt, vtt or json."""
    with sessions() as session:
        job = services.owned_job(session, job_id, key_id)
        recording = session.get(Recording, recording_id) if job is not None else None
        if recording is None or recording.job_id != job_id:
            raise HTTPException(404, "no such recording")
        if recording.status != DONE or not recording.outputs:
            raise HTTPException(409, f"recording is {recording.status}, not done")
        return Response(recording.outputs[format], media_type=MEDIA_TYPES[format])


@router.post("/{job_id}/cancel", response_model=JobDetail, responses={**_ERRORS, 409: {"model": ErrorBody}})
def cancel_job(job_id: str, key_id: KeyDep, sessions: SessionsDep, dispatch: DispatcherDep) -> JobDetail:
    """Cancel a job that has not ended (409 if it has)."""
    with sessions() as session:
        before = services.owned_job(session, job_id, key_id)
        if before is None:
            raise HTTPException(404, "no such job")
        if before.status in services.FINAL:
            raise HTTPException(409, f"job already {before.status}")
    job = services.cancel(sessions, job_id, key_id)
    if job is not None and (job.options or {}).get("callback_url"):
        notify = getattr(dispatch, "job_finished", None)
        if notify is not None:
            notify(job_id)
    with sessions() as session:
        return services.detail(session, session.get(Job, job_id))
