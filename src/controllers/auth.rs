//! Turning a resource's authentication block into a KMS identity: the
//! endpoint (host and CA), and the credentials read from the referenced
//! Secret under the namespace rule.

use super::Context;
use super::error::SyncError;
use super::refs::{get_secret, namespace_of, resolve_endpoint, secret_string};
use crate::api::common::{GenericAuthentication, TlsConfig};
use crate::kms::{Credentials, Identity};

/// Read universal-auth credentials from the Secret `ns/name`.
pub async fn universal_credentials(
    ctx: &Context,
    ns: &str,
    name: &str,
) -> Result<Credentials, SyncError> {
    let creds = get_secret(&ctx.client, ns, name)
        .await?
        .ok_or_else(|| SyncError::Reference {
            reason: "CredentialsNotFound",
            message: format!("credentials Secret {ns}/{name} not found"),
        })?;
    let key = |k: &str| {
        secret_string(&creds, k)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
            .ok_or_else(|| SyncError::Reference {
                reason: "CredentialsInvalid",
                message: format!("credentials Secret {ns}/{name} has no {k} key"),
            })
    };
    Ok(Credentials::UniversalAuth {
        client_id: key("clientId")?,
        client_secret: key("clientSecret")?.into(),
    })
}

/// The identity of a push or dynamic secret (its generic authentication
/// block), checked against the host allow list.
pub async fn generic_identity(
    ctx: &Context,
    ns: &str,
    host_api: Option<&str>,
    tls: Option<&TlsConfig>,
    auth: &GenericAuthentication,
) -> Result<Identity, SyncError> {
    let allow_cross = ctx.settings.allow_cross_namespace_refs;
    let credentials = if let Some(ua) = &auth.universal_auth {
        let cns = namespace_of(
            ns,
            ua.credentials_ref.secret_namespace.as_deref(),
            "authentication.universalAuth.credentialsRef",
            allow_cross,
        )?;
        universal_credentials(ctx, &cns, &ua.credentials_ref.secret_name).await?
    } else {
        let method = if auth.kubernetes_auth.is_some() {
            "kubernetesAuth"
        } else if auth.aws_iam_auth.is_some() {
            "awsIamAuth"
        } else if auth.azure_auth.is_some() {
            "azureAuth"
        } else if auth.gcp_id_token_auth.is_some() {
            "gcpIdTokenAuth"
        } else if auth.gcp_iam_auth.is_some() {
            "gcpIamAuth"
        } else if auth.ldap_auth.is_some() {
            "ldapAuth"
        } else {
            return Err(SyncError::Spec(
                "no authentication method is set".to_owned(),
            ));
        };
        return Err(SyncError::Spec(format!(
            "authentication.{method} is not supported by this version of kms-operator yet; use universalAuth"
        )));
    };
    let endpoint = resolve_endpoint(
        &ctx.client,
        ns,
        host_api,
        tls,
        &ctx.global_config(),
        allow_cross,
    )
    .await?;
    ctx.kms.check_endpoint(&endpoint).map_err(SyncError::Kms)?;
    Ok(Identity {
        endpoint,
        credentials,
    })
}
